"""The report's reward pictures: each reward component's progress, and the reward-hacking guard's proxy against
gold with every flag and what the run did (written into the run's report by workers/coordinator/report.py).

    components.png   per component of a multi training reward, its progress in units of its own spread:
                     (mean - first mean) / first spread, over the rollouts per iteration and, where the
                     reward-hacking guard scored them, over the held-out images per weights version
    hacking.png      proxy (training) reward vs gold per weights version, flags and rollbacks marked
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

from resources.ledger import Ledger
from workers.coordinator.plots import figure, proxy_gold_png, to_png

Series = dict[str, tuple[list[float], list[float]]]
"""name -> (xs, ys) of one line each."""


def components_plot(ledger: Ledger) -> bytes:
    """components.png: a stalled component stays flat near 0 while the weighted total climbs, whatever its units."""
    rollout, heldout = component_progress(ledger)
    panels = (("rollouts", "iteration", rollout), ("held-out images", "weights version", heldout))
    fig, axes = figure(1, 2, figsize=(10, 3.2))
    for ax, (where, xlabel, series) in zip(axes.flat, panels, strict=True):
        for name, (xs, ys) in series.items():
            ax.plot(xs, ys, marker="o", markersize=3, label=name)
        ax.axhline(0.0, color="#999999", linewidth=0.8)
        ax.set(title=f"reward components: {where}", xlabel=xlabel, ylabel="change / first spread")
        if series:
            ax.legend(fontsize="small")
    if not rollout and not heldout:
        fig.suptitle("reward components (a single reward in this run)")
    return to_png(fig)


def component_progress(ledger: Ledger) -> tuple[Series, Series]:
    """Each multi-reward component's progress (`progress`) over the rollouts per iteration (the requests'
    components) and over the held-out images per weights version (`hacking_signals.proxy_components`), both in
    units of the component's spread within the first iteration's rollouts."""
    rollout = ledger.query(
        "SELECT j.key, r.iteration, avg(CAST(j.value AS DOUBLE)), stddev_pop(CAST(j.value AS DOUBLE)) "
        "FROM requests r, json_each(r.reward_components) j WHERE r.status = 'done' AND r.kind = 'rollout' "
        "GROUP BY ALL ORDER BY 1, 2"
    ).rows
    spreads: dict[str, float | None] = {}
    for name, _, _, spread in rollout:  # ordered by component, then iteration: the first row is the first iteration
        spreads.setdefault(name, spread)
    heldout = ledger.query(
        "SELECT weights_version, proxy_components FROM hacking_signals WHERE proxy_components IS NOT NULL "
        "ORDER BY iteration"
    ).rows
    held = [(name, version, float(mean)) for version, parts in heldout for name, mean in json.loads(parts).items()]
    return progress([(n, k, m) for n, k, m, _ in rollout], spreads), progress(held, spreads)


def progress(rows: list[tuple[str, float, float]], spreads: dict[str, float | None]) -> Series:
    """Per component, (x, (mean - its first mean) / spread) from (name, x, mean) rows in x order; `spreads` holds
    each component's spread within its first iteration's rollouts (a missing or zero spread: the raw change)."""
    series: Series = {}
    first: dict[str, float] = {}
    for name, x, mean in rows:
        first.setdefault(name, mean)
        spread = spreads.get(name)
        scale = spread if spread is not None and math.isfinite(spread) and spread > 0 else 1.0
        xs, ys = series.setdefault(name, ([], []))
        xs.append(x)
        ys.append((mean - first[name]) / scale)
    return series


def hacking_plot(ledger: Ledger) -> bytes:
    """hacking.png: proxy against gold per weights version, flagged validations and rollbacks marked."""
    rows = ledger.query(
        "SELECT weights_version, proxy, gold, flagged, restored_version, proxy_reward, gold_reward "
        "FROM reward_hacking ORDER BY iteration"
    ).rows
    labels = (rows[-1][5][:30], rows[-1][6][:30]) if rows else ("", "")
    return proxy_gold_png(
        [r[0] for r in rows],
        [r[1] for r in rows],
        [r[2] for r in rows],
        [bool(r[3]) for r in rows],
        [r[0] for r in rows if r[4] is not None],
        labels,
    )


def hacking_html(ledger: Ledger, out_dir: Path) -> str:
    """Each flagged validation: the rule that fired, its numbers, what the run did, and the held-out grids of the
    base and the flagged weights side by side (when the validate phase drew them)."""
    rows = ledger.query(
        "SELECT iteration, rule, detail, action, restored_version, restored_gold FROM reward_hacking "
        "WHERE flagged ORDER BY iteration"
    ).rows
    total = ledger.query("SELECT count(*) FROM hacking_signals").rows[0][0]
    if not rows:
        return f"<h2>Reward hacking</h2><p>No flag in {total} validation(s) (docs/REWARD_HACKING.md).</p>"
    items = []
    for k, rule, detail, action, restored, gold in rows:
        did = f"rolled back to v{restored} (gold {gold:.4g})" if restored is not None else action
        grids = "".join(
            figure_html(f"grids/it-{i:06d}-validation.png", f"v{i}")
            for i in (0, k)
            if (out_dir / "grids" / f"it-{i:06d}-validation.png").is_file()
        )
        items.append(
            f"<li>iteration {k}: <code>{html.escape(rule or '')}</code>: {html.escape(detail or '')}; "
            f"{html.escape(did or '')}<br>{grids}</li>"
        )
    return (
        f"<h2>Reward hacking</h2><p>{len(rows)} of {total} validation(s) flagged "
        f"(<code>SELECT * FROM reward_hacking</code>; docs/REWARD_HACKING.md):</p><ul>{''.join(items)}</ul>"
    )


def figure_html(src: str, caption: str, lines: tuple[str, ...] | list[str] = ()) -> str:
    """An image with its caption, and `lines` as a numbered list under it."""
    items = "".join(f"<li>{html.escape(line).replace(chr(10), '<br>')}</li>" for line in lines)
    return (
        f'<figure><img src="{src}" alt="{html.escape(caption)}"><figcaption>{html.escape(caption)}'
        f"{'<ol>' + items + '</ol>' if items else ''}</figcaption></figure>"
    )
