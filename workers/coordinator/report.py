"""The run's report folder, rebuilt from the ledger after every iteration: plots (PNG) and one HTML page.

    <run-dir>/report/index.html            summary table, the plots, sample grids
    <run-dir>/report/reward.png            training reward per iteration
    <run-dir>/report/validation.png        held-out score per weights version
    <run-dir>/report/cost.png              USD per iteration, spot vs reserved
    <run-dir>/report/preemptions.png       preemption timeline: worker processes per slot, preemptions
    <run-dir>/report/sync.png              bytes per weights version, dense vs PULSE
    <run-dir>/report/exploration.png       rank consistency (Kendall tau, Spearman rho) and variance gain of each plan
    <run-dir>/report/payoff.png            did exploration pay: explored vs random seeds' reward variance per iteration
    <run-dir>/report/categories.png        held-out score per category (counting, binding, position) per version
    <run-dir>/report/components.png        a multi-reward's components: each one's progress in units of its first
                                           spread, over the rollouts and the held-out images (report_rewards.py)
    <run-dir>/report/hacking.png           reward hacking: proxy vs gold reward per version, flagged validations
                                           and rollbacks marked (the page lists each flag with base/flagged grids)
    <run-dir>/report/heldout_samples.png   latest validated weights: held-out samples captioned with pass/fail
    <run-dir>/report/before_after.png      base weights vs latest validated ones, same prompts and seeds
                                           (these two and their .json captions: the validate phase, samples.py)
    <run-dir>/report/grids/it-*-{rollouts,validation,heldout}.png   written by the rollout / validate phases

Example:
    written = write_report(ledger, store, "demo", Path("runs/demo/report"))
    print(written.index)
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

from resources.ledger import Ledger
from workers.coordinator.plots import bar_plot_png, figure, line_plot_png, to_png
from workers.coordinator.report_rewards import components_plot, figure_html, hacking_html, hacking_plot


@dataclass
class WrittenReport:
    index: Path
    plots: dict[str, bytes] = field(default_factory=dict)


def write_report(ledger: Ledger, store, run: str, out_dir: Path) -> WrittenReport:
    """(Re)write every plot and index.html from the ledger; returns the page and the plots' PNG bytes."""
    with ledger.held():  # some 50 queries on one connection (the ledger is held a few seconds)
        return _write_report(ledger, store, run, out_dir)


def _write_report(ledger: Ledger, store, run: str, out_dir: Path) -> WrittenReport:
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = {
        "reward": _reward_plot(ledger),
        "validation": _validation_plot(ledger),
        "cost": _cost_plot(ledger),
        "preemptions": _preemption_plot(ledger),
        "sync": _sync_plot(ledger),
        "exploration": _exploration_plot(ledger),
        "payoff": _payoff_plot(ledger),
        "categories": _category_plot(ledger),
        "hacking": hacking_plot(ledger),
        "components": components_plot(ledger),
    }
    for name, png in plots.items():
        (out_dir / f"{name}.png").write_bytes(png)
    index = out_dir / "index.html"
    index.write_text(_page(ledger, run, out_dir, list(plots)))
    return WrittenReport(index, plots)


def summary_rows(ledger: Ledger) -> list[dict]:
    """One row per iteration: reward, held-out score, cost split, wall time (also the CLI's summary table)."""
    return ledger.query("""
        SELECT i.iteration, i.status, t.reward_mean, t.zero_std_ratio, v.score AS heldout_score,
               v.reward AS heldout_reward, c.wall_s, c.usd_total, c.usd_spot, c.usd_reserved,
               (SELECT count(*) FROM preemptions p
                WHERE p.preempted_at >= i.started_at AND p.preempted_at < coalesce(i.ended_at, now())) AS preemptions,
               s.dense_bytes, s.patch_bytes
        FROM iterations i
        LEFT JOIN train_steps t ON t.iteration = i.iteration AND t.step = 0
        LEFT JOIN validation v ON v.iteration = i.iteration
        LEFT JOIN cost_per_iteration c ON c.iteration = i.iteration
        LEFT JOIN syncs s ON s.version = i.iteration AND s.iteration = i.iteration
        ORDER BY i.iteration""").as_dicts()


def _reward_plot(ledger: Ledger) -> bytes:
    rows = ledger.query(
        "SELECT iteration, reward_mean, reward_std FROM train_steps WHERE step = 0 ORDER BY iteration"
    ).rows
    return line_plot_png(
        {
            "reward mean": ([r[0] for r in rows], [r[1] for r in rows]),
            "within-group std": ([r[0] for r in rows], [r[2] for r in rows]),
        },
        "training reward",
        "iteration",
        "reward",
    )


def validation_rewards(ledger: Ledger) -> list[str]:
    """The rewards that scored the held-out images, in the order they first did (NULL: an unnamed score)."""
    rows = ledger.query(
        "SELECT coalesce(reward, 'unnamed') AS reward, min(iteration) AS first FROM validation "
        "GROUP BY ALL ORDER BY first"
    ).rows
    return [r[0] for r in rows]


def _reward_label(rewards: list[str]) -> str:
    label = ", ".join(rewards) or "none yet"
    return label if len(label) <= 60 else label[:57] + "..."


def _validation_plot(ledger: Ledger) -> bytes:
    rows = ledger.query("SELECT weights_version, score FROM validation ORDER BY weights_version").rows
    return line_plot_png(
        {"held-out": ([r[0] for r in rows], [r[1] for r in rows])},
        f"validation ({_reward_label(validation_rewards(ledger))})",
        "weights version",
        "score",
    )


def _cost_plot(ledger: Ledger) -> bytes:
    rows = ledger.query("SELECT iteration, usd_spot, usd_reserved FROM cost_per_iteration ORDER BY iteration").rows
    return bar_plot_png(
        [str(r[0]) for r in rows],
        {"spot": [r[1] for r in rows], "reserved": [r[2] for r in rows]},
        "cost per iteration",
        "USD",
    )


def _preemption_plot(ledger: Ledger) -> bytes:
    """The preemption timeline: one lane per worker slot, a bar per worker process it held (a preempted slot
    gets a new process), a mark per preemption (with or without notice), rollout phases shaded."""
    workers = ledger.query(
        f"SELECT worker_id, {_run_s('started_at')}, {_run_s('coalesce(ended_at, now())')} "
        "FROM workers WHERE role = 'rollout' ORDER BY started_at"
    ).rows
    hits = ledger.query(
        f"SELECT worker_id, {_run_s('preempted_at')}, notice_s > 0 FROM preemptions ORDER BY preempted_at"
    ).rows
    rollouts = ledger.query(
        f"SELECT {_run_s('started_at')}, {_run_s('coalesce(ended_at, now())')} FROM phases "
        "WHERE phase = 'rollout' ORDER BY started_at"
    ).rows
    lanes = sorted({_slot(w) for w, _, _ in workers} | {_slot(w) for w, _, _ in hits})
    fig, ax = figure()
    for i, (start, end) in enumerate(rollouts):
        ax.axvspan(start, end, color="#dddddd", label="rollout phase" if i == 0 else None)
    for worker, start, end in workers:
        ax.broken_barh(
            [(start, max(end - start, 0.0))],
            (lanes.index(_slot(worker)) - 0.12, 0.24),
            color="#4c72b0",
            label="worker process" if worker == workers[0][0] else None,
        )
    for notice, style, label in (
        (True, dict(marker="v", color="#dd8452"), "preempted with notice"),
        (False, dict(marker="X", color="#c44e52"), "preempted without notice"),
    ):
        points = [(t, lanes.index(_slot(w))) for w, t, n in hits if bool(n) == notice]
        if points:
            ax.scatter([t for t, _ in points], [y for _, y in points], s=60, zorder=3, label=label, **style)
    without = sum(1 for _, _, n in hits if not n)
    title = (
        f"preemptions: {len(hits)} ({without} without notice)"
        if hits
        else "preemptions (none in this run)"
        if workers
        else "preemptions (no rollout workers in this run)"
    )
    ax.set(
        title=title,
        xlabel="seconds since the run started",
        yticks=range(len(lanes)),
        yticklabels=lanes,
        ylim=(-0.6, len(lanes) + 0.4),
    )  # room above the top lane for the legend
    if workers or hits:
        ax.legend(loc="upper center", fontsize="small", ncol=2)
    return to_png(fig)


def _run_s(column: str) -> str:
    """SQL: seconds from the run's start to a timestamp column."""
    return f"date_diff('microsecond', (SELECT min(started_at) FROM runs), {column}) / 1e6"


def _slot(worker_id: str) -> str:
    return worker_id.split(".")[0]


def _sync_plot(ledger: Ledger) -> bytes:
    rows = ledger.query(
        "SELECT version, dense_bytes, patch_bytes FROM syncs WHERE kind = 'patch' ORDER BY version"
    ).rows
    return line_plot_png(
        {
            "dense BF16": ([r[0] for r in rows], [r[1] for r in rows]),
            "PULSE patch": ([r[0] for r in rows], [r[2] for r in rows]),
        },
        "weight sync per version",
        "weights version",
        "bytes",
    )


def _exploration_plot(ledger: Ledger) -> bytes:
    """Per plan (x = the iteration during whose training it was explored): how well stale, cheap rankings held up
    on the real rollout, the variance it bought over random seeds, and the share of the budget exploration used."""
    rows = ledger.query("""
        SELECT iteration, kendall_tau, spearman_rho, variance_gain, time_used_s / nullif(budget_s, 0) AS budget_share
        FROM exploration ORDER BY iteration""").rows
    series = {
        name: ([r[0] for r in rows if r[i] is not None], [r[i] for r in rows if r[i] is not None])
        for i, name in ((1, "Kendall tau"), (2, "Spearman rho"), (3, "variance gain"), (4, "budget used"))
    }
    fallbacks = ledger.query("SELECT count(*) FROM exploration WHERE fallback_random").rows[0][0]
    title = (
        f"exploration ({len(rows)} plans, {fallbacks} fell back to random seeds)"
        if rows
        else "exploration (none in this run)"
    )
    return line_plot_png(series, title, "iteration (plan made)", "value")


def _payoff_plot(ledger: Ledger) -> bytes:
    """Per rollout iteration: the reward variance of the groups trained on, explored seeds' vs random seeds'
    (the same iteration's default-seed prompts, and the running baseline the bandit judges gains against)."""
    rows = ledger.query(
        "SELECT iteration, explored_variance, random_variance, baseline_variance, "
        "explored_stale_variance, random_stale_variance FROM exploration_payoff ORDER BY iteration"
    ).rows
    names = (
        "explored seeds",
        "random seeds (same iteration)",
        "random baseline",
        "explored, stale rewards",
        "default seeds, stale rewards",
    )
    series = {
        name: ([r[0] for r in rows if r[i] is not None], [r[i] for r in rows if r[i] is not None])
        for i, name in enumerate(names, start=1)
    }
    paid, explored = ledger.query(
        "SELECT count(*) FILTER (WHERE paid_off), count(explored_variance) FROM exploration_payoff"
    ).rows[0]
    title = (
        f"exploration payoff: {paid} of {explored} explored rollouts beat random seeds"
        if explored
        else "exploration payoff (no explored rollout in this run)"
    )
    return line_plot_png(
        {n: xy for n, xy in series.items() if xy[0]} or {"none": ([], [])}, title, "iteration", "reward variance"
    )


def _category_plot(ledger: Ledger) -> bytes:
    rows = ledger.query("""
        SELECT v.weights_version, substr(s.criterion, 10) AS category, s.score
        FROM validation_scores s JOIN validation v USING (iteration)
        WHERE s.criterion LIKE 'category.%' ORDER BY category, v.weights_version""").rows
    series: dict[str, tuple[list, list]] = {}
    for version, category, score in rows:
        xs, ys = series.setdefault(category, ([], []))
        xs.append(version)
        ys.append(score)
    return line_plot_png(
        series or {"none": ([], [])},
        f"held-out score per category ({_reward_label(validation_rewards(ledger))})",
        "weights version",
        "score",
    )


def _samples_html(out_dir: Path) -> str:
    """The latest captioned held-out grid and before/after pair, their captions listed under them."""
    import json

    parts = []
    for name, title in (
        ("heldout_samples", "Held-out samples, pass/fail per criterion"),
        ("before_after", "Before / after: base weights vs the latest validated ones"),
    ):
        if (out_dir / f"{name}.png").is_file() and (out_dir / f"{name}.json").is_file():
            meta = json.loads((out_dir / f"{name}.json").read_text())
            caption = f"{name}: weights v{meta['weights_version']}"
            parts.append(f"<h2>{title}</h2>" + figure_html(f"{name}.png", caption, meta["captions"]))
    return "".join(parts)


def _page(ledger: Ledger, run: str, out_dir: Path, plots: list[str]) -> str:
    rows = summary_rows(ledger)
    columns = [
        "iteration",
        "status",
        "reward_mean",
        "heldout_score",
        "usd_spot",
        "usd_reserved",
        "preemptions",
        "patch_bytes",
    ]
    head = "".join(f"<th>{c}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(r.get(c))}</td>" for c in columns) + "</tr>" for r in rows)
    images = "".join(f'<figure><img src="{p}.png" alt="{p}"><figcaption>{p}</figcaption></figure>' for p in plots)
    grids = sorted((out_dir / "grids").glob("*.png")) if (out_dir / "grids").is_dir() else []
    grid_html = "".join(
        f'<figure><img src="grids/{g.name}" alt="{g.stem}"><figcaption>{g.stem}</figcaption></figure>' for g in grids
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>spotlight run {html.escape(run)}</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
        "padding:2px 6px;text-align:right}figure{display:inline-block;margin:8px}img{image-rendering:pixelated}</style>"
        f"</head><body><h1>spotlight run <code>{html.escape(run)}</code></h1>{_heldout_html(ledger)}"
        f"<table><tr>{head}</tr>{body}</table>"
        f"{hacking_html(ledger, out_dir)}{_samples_html(out_dir)}"
        f"<h2>Curves, cost, preemptions, sync, exploration</h2>{images}"
        f"<h2>Samples</h2>{grid_html}</body></html>"
    )


def _heldout_html(ledger: Ledger) -> str:
    """Which reward scored the held-out score (heldout_score), on how many prompts, with how many fixed seeds."""
    rows = ledger.query(
        "SELECT coalesce(reward, 'unnamed') AS reward, max(num_prompts) AS prompts, count(*) AS n "
        "FROM validation GROUP BY ALL ORDER BY min(iteration)"
    ).rows
    if not rows:
        return "<p>Held-out score: no validation yet.</p>"
    parts = [
        f"<code>{html.escape(reward)}</code>"
        + (
            " (MiniGenEval's detector: the strict GenEval score)"
            if reward == "minigeneval_strict"
            else " (mean over every image)"
        )
        + f" on {prompts} held-out prompts, {n} validation(s)"
        for reward, prompts, n in rows
    ]
    return f"<p>Held-out score (heldout_score) scored by {'; '.join(parts)}, fixed seeds.</p>"


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))
