"""PNG pictures a person wants to look at: image grids and plots of the ledger's numbers (matplotlib, Agg).

Example:
    png = image_grid_png(images_NHW3, columns=8)
    png = captioned_grid_png(images_NHW3, ["three red circles\ncount.0 ✓ shape.0 ✗", ...], columns=4)
    png = line_plot_png({"held-out": (versions, scores)}, "validation", "weights version", "strict score")
    png = proxy_gold_png(versions, proxy, gold, flagged, rollbacks=[5], labels=("jpeg_compressibility", "minigeneval"))
"""

from __future__ import annotations

import io
from typing import Sequence

import numpy as np


def image_grid_png(images_NHW3: np.ndarray, columns: int = 8, scale: int = 3) -> bytes:
    """uint8 images tiled in rows of `columns`, each upscaled `scale`x (nearest) with a 1-pixel gap."""
    from PIL import Image

    n, h, w, _ = images_NHW3.shape
    columns = max(1, min(columns, n))
    rows = -(-n // columns)
    grid = np.full((rows * (h + 1) + 1, columns * (w + 1) + 1, 3), 255, dtype=np.uint8)
    for i, image in enumerate(images_NHW3):
        r, c = divmod(i, columns)
        grid[1 + r * (h + 1) : 1 + r * (h + 1) + h, 1 + c * (w + 1) : 1 + c * (w + 1) + w] = image
    picture = Image.fromarray(grid).resize((grid.shape[1] * scale, grid.shape[0] * scale), Image.NEAREST)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return buffer.getvalue()


def captioned_grid_png(images_NHW3: np.ndarray, captions: Sequence[str], columns: int = 4) -> bytes:
    """Images in rows of `columns`, each with its caption above it (a prompt and its criteria, say)."""
    if len(images_NHW3) != len(captions) or not len(captions):
        raise ValueError(
            f"captioned_grid_png needs one caption per image, got {len(images_NHW3)} images, {len(captions)} captions"
        )
    columns = max(1, min(columns, len(captions)))
    rows = -(-len(captions) // columns)
    lines = max(c.count("\n") + 1 for c in captions)
    fig, axes = figure(rows, columns, figsize=(2.3 * columns, rows * (2.4 + 0.2 * lines)))
    for i, ax in enumerate(np.asarray(axes).flat):
        ax.axis("off")
        if i < len(captions):
            ax.imshow(images_NHW3[i], interpolation="nearest")
            ax.set_title(captions[i], fontsize=7)
    return to_png(fig)


def line_plot_png(
    series: dict[str, tuple[Sequence[float], Sequence[float]]], title: str, xlabel: str, ylabel: str
) -> bytes:
    """One line per named (xs, ys) series."""
    fig, ax = figure()
    for name, (xs, ys) in series.items():
        ax.plot(list(xs), list(ys), marker="o", markersize=3, label=name)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if len(series) > 1:
        ax.legend()
    return to_png(fig)


def proxy_gold_png(
    versions: Sequence[int],
    proxy: Sequence[float],
    gold: Sequence[float],
    flagged: Sequence[bool],
    rollbacks: Sequence[int],
    labels: tuple[str, str],
) -> bytes:
    """The proxy (training) reward on the left axis and the gold reward on the right, per weights version, with the
    flagged validations marked and each rollback (at the flagged version) as a dashed line."""
    fig, left = figure()
    right = left.twinx()
    left.plot(list(versions), list(proxy), marker="o", markersize=3, color="#4c72b0", label=f"proxy: {labels[0]}")
    right.plot(list(versions), list(gold), marker="s", markersize=3, color="#55a868", label=f"gold: {labels[1]}")
    hits = [i for i, f in enumerate(flagged) if f]
    if hits:
        left.scatter(
            [versions[i] for i in hits],
            [proxy[i] for i in hits],
            s=90,
            marker="X",
            color="#c44e52",
            zorder=3,
            label="flagged",
        )
        right.scatter([versions[i] for i in hits], [gold[i] for i in hits], s=90, marker="X", color="#c44e52", zorder=3)
    for n, version in enumerate(rollbacks):
        left.axvline(version, linestyle="--", color="#c44e52", alpha=0.6, label="rollback" if n == 0 else None)
    title = (
        f"proxy vs gold: {len(hits)} flagged, {len(rollbacks)} rollback(s)"
        if versions
        else "proxy vs gold (no validation yet)"
    )
    left.set(title=title, xlabel="weights version", ylabel="proxy (training reward)")
    right.set_ylabel("gold (held-out reward)")
    handles = [h for ax in (left, right) for h in ax.get_legend_handles_labels()[0]]
    left.legend(handles, [h.get_label() for h in handles], fontsize="small", loc="best")
    return to_png(fig)


def histogram_png(values: Sequence[float], title: str, xlabel: str) -> bytes:
    fig, ax = figure()
    ax.hist(list(values), bins=min(20, max(5, len(values) // 2)), color="#4c72b0")
    ax.set(title=title, xlabel=xlabel, ylabel="count")
    return to_png(fig)


def bar_plot_png(labels: Sequence[str], stacks: dict[str, Sequence[float]], title: str, ylabel: str) -> bytes:
    """Stacked bars, one stack per named series (e.g. spot / reserved USD per iteration)."""
    fig, ax = figure()
    bottom = np.zeros(len(labels))
    for name, values in stacks.items():
        ax.bar(list(labels), list(values), bottom=bottom, label=name)
        bottom += np.asarray(values, dtype=float)
    ax.set(title=title, ylabel=ylabel)
    ax.legend()
    ax.tick_params(axis="x", labelrotation=90)
    return to_png(fig)


def figure(nrows: int = 1, ncols: int = 1, figsize: tuple[float, float] = (6, 3.2)):
    import matplotlib

    matplotlib.use("Agg")  # no display on workers, CI or the Dagster daemon
    import matplotlib.pyplot as plt

    return (
        plt.subplots(nrows, ncols, figsize=figsize, dpi=100, squeeze=False)
        if nrows * ncols > 1
        else plt.subplots(figsize=figsize, dpi=100)
    )


def to_png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()
