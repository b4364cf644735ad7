"""The run ledger's schema: tables by migration step, derived views, and the upgrade path.

A ledger is built by applying every migration from empty, so a fresh file and an old
file brought up to date have the same schema by construction. All times are UTC
(`TIMESTAMP` without zone); money is USD; durations are seconds (`*_s`).

History:
    v0  first layout: per-criterion validation scores in a JSON column.
    v1  per-criterion scores in the long table `validation_scores` (plain GROUP BY
        instead of JSON functions); adds `requests.status`, `attempts`, `train_steps`.
    v2  `syncs.replica` (multi-trainer sync: one row per replica and round, key
        (version, kind, replica)); exploration gains the bandit's view of an iteration:
        seeds per prompt, cache level, critical-path overhead, variance gain over random
        seeds, Kendall tau / Spearman rho of stale vs fresh rewards, random fallback.
    v3  `seed_groups`: per prompt of each rollout, whether exploration or the default
        (random) seeds chose its seeds, and the reward variance of the group trained on
        against the random-seed baseline; the view `exploration_payoff` sums it per iteration.
    v4  `requests.reward_components` (a multi-reward's raw component values, JSON) with the view
        `reward_components` (their means per iteration and request kind); `validation.reward` (the
        reward that scored the held-out images; earlier rows were all MiniGenEval's detector,
        `minigeneval_strict`).
    v5  `attempts.steps_lost` and `attempts.seconds_lost`: the steps an attempt computed but had not committed when
        it ended, so a preemption of a node running several requests (an SP node) charges each its own loss.
        NULL on rows written before.
    v6  `hacking_signals`: per validation, the training (proxy) and gold rewards of the held-out images with
        their standard errors, cheap image statistics, and whether the reward-hacking rule flagged it (and
        which test fired, and what the run did); `hacking_rollbacks`: each rollback to the best-gold weights.
        The view `reward_hacking` sets each signal against the base's.
    v7  `workers.device_type` and `workers.kernel_set` (what decides a worker's float bits: its CPU capability and
        thread count, or its GPU); `requests.kernel_sets` (JSON list of the kernel sets that computed the result's
        steps) and `requests.mixed_kernels` (more than one: resumed on another kind of worker, so it is held to a
        tolerance, not to an uninterrupted run's hash). NULL / false on rows written before.
Views are derived data: they are dropped and re-created by every upgrade.
"""

from __future__ import annotations

import duckdb

SCHEMA_VERSION = 7
PHASES = ("sync", "rollout", "train", "explore", "validate")


class LedgerSchemaError(RuntimeError):
    """The file cannot be used as a ledger by this version of spotlight (says why)."""


_V0_TABLES = """
CREATE TABLE schema_version (version INTEGER NOT NULL, applied_at TIMESTAMP NOT NULL, note VARCHAR NOT NULL);
CREATE TABLE runs (
    run_id VARCHAR PRIMARY KEY, started_at TIMESTAMP NOT NULL, ended_at TIMESTAMP,
    status VARCHAR NOT NULL, preset VARCHAR, store_url VARCHAR, queue_url VARCHAR,
    config JSON, price_table JSON);
CREATE TABLE iterations (
    iteration INTEGER PRIMARY KEY, weights_version INTEGER, started_at TIMESTAMP NOT NULL,
    ended_at TIMESTAMP, critical_path_s DOUBLE, status VARCHAR NOT NULL);
CREATE TABLE phases (
    iteration INTEGER NOT NULL, phase VARCHAR NOT NULL, started_at TIMESTAMP NOT NULL,
    ended_at TIMESTAMP, PRIMARY KEY (iteration, phase));
CREATE TABLE workers (
    worker_id VARCHAR PRIMARY KEY, role VARCHAR NOT NULL, instance_type VARCHAR NOT NULL,
    gpu_type VARCHAR, num_gpus INTEGER NOT NULL, spot BOOLEAN NOT NULL,
    usd_per_hour DOUBLE NOT NULL, price_source VARCHAR NOT NULL,
    started_at TIMESTAMP NOT NULL, ended_at TIMESTAMP, end_reason VARCHAR);
CREATE TABLE requests (
    request_id VARCHAR PRIMARY KEY, iteration INTEGER NOT NULL, kind VARCHAR NOT NULL,
    prompt VARCHAR NOT NULL, seed BIGINT NOT NULL, weights_version INTEGER NOT NULL,
    worker_id VARCHAR, attempts INTEGER NOT NULL, result_hash VARCHAR, reward DOUBLE,
    enqueued_at TIMESTAMP, finished_at TIMESTAMP, arm VARCHAR);
CREATE TABLE preemptions (
    worker_id VARCHAR NOT NULL, preempted_at TIMESTAMP NOT NULL, notice_s DOUBLE NOT NULL,
    request_id VARCHAR, steps_lost INTEGER NOT NULL, seconds_lost DOUBLE,
    state_committed BOOLEAN NOT NULL, PRIMARY KEY (worker_id, preempted_at));
CREATE TABLE syncs (
    version INTEGER NOT NULL, kind VARCHAR NOT NULL, iteration INTEGER,
    dense_bytes BIGINT NOT NULL, patch_bytes BIGINT NOT NULL, changed_fraction DOUBLE,
    encode_s DOUBLE, apply_s DOUBLE, weights_hash VARCHAR, PRIMARY KEY (version, kind));
CREATE TABLE exploration (
    iteration INTEGER PRIMARY KEY, arm VARCHAR NOT NULL, budget_s DOUBLE NOT NULL,
    time_used_s DOUBLE NOT NULL, num_requests INTEGER NOT NULL, reward_variance DOUBLE,
    rank_consistency DOUBLE, ucb_score DOUBLE);
CREATE TABLE validation (
    iteration INTEGER PRIMARY KEY, weights_version INTEGER NOT NULL, score DOUBLE NOT NULL,
    num_prompts INTEGER NOT NULL, recorded_at TIMESTAMP NOT NULL, criteria_json JSON);
"""

_V1_CHANGES = """
CREATE TABLE validation_scores (
    iteration INTEGER NOT NULL, criterion VARCHAR NOT NULL, score DOUBLE NOT NULL,
    PRIMARY KEY (iteration, criterion));
INSERT INTO validation_scores
    SELECT v.iteration, j.key, CAST(j.value AS DOUBLE) FROM validation v, json_each(v.criteria_json) j
    WHERE v.criteria_json IS NOT NULL;
ALTER TABLE validation DROP COLUMN criteria_json;
ALTER TABLE requests ADD COLUMN status VARCHAR DEFAULT 'done';
CREATE TABLE attempts (
    request_id VARCHAR NOT NULL, attempt INTEGER NOT NULL, worker_id VARCHAR NOT NULL,
    started_at TIMESTAMP NOT NULL, ended_at TIMESTAMP, outcome VARCHAR NOT NULL,
    resumed_from_step INTEGER NOT NULL, steps_done INTEGER, PRIMARY KEY (request_id, attempt));
CREATE TABLE train_steps (
    iteration INTEGER NOT NULL, step INTEGER NOT NULL, loss DOUBLE, kl DOUBLE,
    reward_mean DOUBLE, reward_std DOUBLE, zero_std_ratio DOUBLE, clip_fraction DOUBLE,
    grad_norm DOUBLE, learning_rate DOUBLE, duration_s DOUBLE, PRIMARY KEY (iteration, step));
"""

_V2_CHANGES = """
CREATE TABLE syncs_v2 (
    version INTEGER NOT NULL, kind VARCHAR NOT NULL, replica INTEGER NOT NULL DEFAULT 0, iteration INTEGER,
    dense_bytes BIGINT NOT NULL, patch_bytes BIGINT NOT NULL, changed_fraction DOUBLE,
    encode_s DOUBLE, apply_s DOUBLE, weights_hash VARCHAR, PRIMARY KEY (version, kind, replica));
INSERT INTO syncs_v2 (version, kind, replica, iteration, dense_bytes, patch_bytes, changed_fraction, encode_s, apply_s,
    weights_hash)
    SELECT version, kind, 0, iteration, dense_bytes, patch_bytes, changed_fraction, encode_s, apply_s, weights_hash
    FROM syncs;
DROP TABLE syncs;
ALTER TABLE syncs_v2 RENAME TO syncs;
ALTER TABLE exploration ADD COLUMN seeds_per_prompt INTEGER;
ALTER TABLE exploration ADD COLUMN cache_level VARCHAR;
ALTER TABLE exploration ADD COLUMN overhead_s DOUBLE;
ALTER TABLE exploration ADD COLUMN variance_gain DOUBLE;
ALTER TABLE exploration ADD COLUMN kendall_tau DOUBLE;
ALTER TABLE exploration ADD COLUMN spearman_rho DOUBLE;
ALTER TABLE exploration ADD COLUMN fallback_random BOOLEAN;
"""

# Variances are within-group (population) reward variances of the group the trainer keeps (the
# max-variance group_size subset of a wider draw); `stale_*` ones are of exploration's cheap rewards on v(k-1).
_V3_CHANGES = """
CREATE TABLE seed_groups (
    iteration INTEGER NOT NULL, prompt_index INTEGER NOT NULL, prompt VARCHAR NOT NULL, planner VARCHAR NOT NULL,
    source VARCHAR NOT NULL, seeds VARCHAR NOT NULL, num_drawn INTEGER NOT NULL, num_trained INTEGER NOT NULL,
    trained_variance DOUBLE NOT NULL, drawn_variance DOUBLE NOT NULL, baseline_variance DOUBLE,
    stale_variance DOUBLE, stale_default_variance DOUBLE, PRIMARY KEY (iteration, prompt_index));
"""

# Every validation before v4 was the MiniGenEval detector's strict score, which is the reward minigeneval_strict.
_V4_CHANGES = """
ALTER TABLE requests ADD COLUMN reward_components JSON;
ALTER TABLE validation ADD COLUMN reward VARCHAR;
UPDATE validation SET reward = 'minigeneval_strict';
"""

_V5_CHANGES = """
ALTER TABLE attempts ADD COLUMN steps_lost INTEGER;
ALTER TABLE attempts ADD COLUMN seconds_lost DOUBLE;
"""

_V6_CHANGES = """
CREATE TABLE hacking_signals (
    iteration INTEGER PRIMARY KEY, weights_version INTEGER NOT NULL, proxy_reward VARCHAR NOT NULL,
    proxy DOUBLE NOT NULL, proxy_se DOUBLE NOT NULL, gold_reward VARCHAR NOT NULL, gold DOUBLE NOT NULL,
    gold_se DOUBLE NOT NULL, proxy_components JSON, edge_density DOUBLE, colour_entropy DOUBLE,
    saturation DOUBLE, compressed_bytes DOUBLE, diversity DOUBLE, flagged BOOLEAN NOT NULL, rule VARCHAR,
    detail VARCHAR, action VARCHAR, recorded_at TIMESTAMP NOT NULL);
CREATE TABLE hacking_rollbacks (
    iteration INTEGER PRIMARY KEY, restored_version INTEGER NOT NULL, restored_gold DOUBLE NOT NULL,
    into_version INTEGER NOT NULL, learning_rate DOUBLE NOT NULL, kl_beta DOUBLE NOT NULL,
    recorded_at TIMESTAMP NOT NULL);
"""

# What decides a worker's float bits (workers/rollout/kernels.py), and which of them computed each result: results
# resumed across kernel sets are held to a tolerance, not to equal hashes (docs/SPOT_RUNTIME.md).
_V7_CHANGES = """
ALTER TABLE workers ADD COLUMN device_type VARCHAR;
ALTER TABLE workers ADD COLUMN kernel_set VARCHAR;
ALTER TABLE requests ADD COLUMN kernel_sets JSON;
ALTER TABLE requests ADD COLUMN mixed_kernels BOOLEAN DEFAULT false;
"""

# Version -> SQL that upgrades a ledger from version-1 (or from empty for 0).
MIGRATIONS: dict[int, str] = {
    0: _V0_TABLES,
    1: _V1_CHANGES,
    2: _V2_CHANGES,
    3: _V3_CHANGES,
    4: _V4_CHANGES,
    5: _V5_CHANGES,
    6: _V6_CHANGES,
    7: _V7_CHANGES,
}
assert sorted(MIGRATIONS) == list(range(SCHEMA_VERSION + 1))

_NOW = "(current_timestamp AT TIME ZONE 'UTC')"
_SECONDS = "date_diff('microsecond', {a}, {b}) / 1e6"


def _overlap_usd(window: str) -> str:
    """USD a worker `w` costs while alive inside the window `{window}.s` to `{window}.e` (a live one up to now)."""
    start, end = f"greatest(w.started_at, {window}.s)", f"least(coalesce(w.ended_at, {_NOW}), {window}.e)"
    return f"w.usd_per_hour * greatest(0, {_SECONDS.format(a=start, b=end)}) / 3600"


VIEWS: dict[str, str] = {
    # Lifetime and cost of each worker; a live worker is costed up to now.
    "worker_costs": f"""
        SELECT *, {_SECONDS.format(a="started_at", b=f"coalesce(ended_at, {_NOW})")} AS lifetime_s,
               usd_per_hour * lifetime_s / 3600 AS usd
        FROM workers""",
    # Cost of capacity alive during each phase window (explore overlaps train by design).
    "cost_per_phase": f"""
        WITH p AS (SELECT iteration, phase, started_at AS s, coalesce(ended_at, {_NOW}) AS e FROM phases),
        overlap AS (
            SELECT p.iteration, p.phase, p.s, p.e, w.spot,
                   {_overlap_usd("p")} AS usd
            FROM p LEFT JOIN workers w ON w.started_at < p.e AND coalesce(w.ended_at, {_NOW}) > p.s)
        SELECT iteration, phase, {_SECONDS.format(a="min(s)", b="max(e)")} AS wall_s,
               coalesce(sum(usd) FILTER (WHERE spot), 0) AS usd_spot,
               coalesce(sum(usd) FILTER (WHERE NOT spot), 0) AS usd_reserved,
               coalesce(sum(usd), 0) AS usd
        FROM overlap GROUP BY iteration, phase
        ORDER BY iteration, list_position({list(PHASES)}, phase)""",
    # One row per iteration: wall time, USD split spot/reserved, and per phase.
    "cost_per_iteration": f"""
        WITH i AS (SELECT iteration, started_at AS s, coalesce(ended_at, {_NOW}) AS e, critical_path_s FROM iterations),
        overlap AS (
            SELECT i.iteration, w.spot,
                   {_overlap_usd("i")} AS usd
            FROM i LEFT JOIN workers w ON w.started_at < i.e AND coalesce(w.ended_at, {_NOW}) > i.s),
        totals AS (
            SELECT iteration, coalesce(sum(usd) FILTER (WHERE spot), 0) AS usd_spot,
                   coalesce(sum(usd) FILTER (WHERE NOT spot), 0) AS usd_reserved
            FROM overlap GROUP BY iteration),
        by_phase AS (
            SELECT iteration, {", ".join(f"sum(usd) FILTER (WHERE phase = '{p}') AS usd_{p}" for p in PHASES)}
            FROM cost_per_phase GROUP BY iteration)
        SELECT i.iteration, {_SECONDS.format(a="i.s", b="i.e")} AS wall_s, i.critical_path_s,
               t.usd_spot + t.usd_reserved AS usd_total, t.usd_spot, t.usd_reserved,
               CASE WHEN usd_total > 0 THEN t.usd_spot / usd_total END AS spot_share,
               {", ".join(f"coalesce(b.usd_{p}, 0) AS usd_{p}" for p in PHASES)}
        FROM i JOIN totals t USING (iteration) LEFT JOIN by_phase b USING (iteration)
        ORDER BY i.iteration""",
    # Whole-run cost from worker lifetimes, including time outside any iteration.
    "run_cost": """
        SELECT coalesce(sum(usd), 0) AS usd_total,
               coalesce(sum(usd) FILTER (WHERE spot), 0) AS usd_spot,
               coalesce(sum(usd) FILTER (WHERE NOT spot), 0) AS usd_reserved,
               coalesce(sum(lifetime_s) FILTER (WHERE spot), 0) / 3600 AS spot_hours,
               coalesce(sum(lifetime_s) FILTER (WHERE NOT spot), 0) / 3600 AS reserved_hours,
               usd_total - (SELECT coalesce(sum(usd_total), 0) FROM cost_per_iteration) AS usd_outside_iterations
        FROM worker_costs""",
    # Preemptions per spot instance type: how often, with what notice, how much work lost.
    "preemption_summary": """
        WITH per_worker AS (
            SELECT w.worker_id, w.instance_type, w.gpu_type, w.lifetime_s,
                   count(p.preempted_at) AS n, count(p.preempted_at) FILTER (WHERE p.notice_s > 0) AS n_notice,
                   count(p.preempted_at) FILTER (WHERE p.state_committed) AS n_committed,
                   coalesce(sum(p.steps_lost), 0) AS steps_lost, coalesce(sum(p.seconds_lost), 0) AS seconds_lost
            FROM worker_costs w LEFT JOIN preemptions p USING (worker_id)
            WHERE w.spot GROUP BY ALL)
        SELECT instance_type, gpu_type, count(*) AS spot_workers, sum(lifetime_s) / 3600 AS spot_hours,
               sum(n) AS preemptions, sum(n_notice) AS with_notice, sum(n) - sum(n_notice) AS without_notice,
               sum(n_committed) AS state_committed,
               CASE WHEN sum(lifetime_s) > 0 THEN sum(n) / (sum(lifetime_s) / 3600) END AS preemptions_per_hour,
               sum(steps_lost) AS steps_lost, sum(seconds_lost) AS seconds_lost,
               CASE WHEN sum(n) > 0 THEN sum(steps_lost) / sum(n) END AS steps_lost_per_preemption
        FROM per_worker GROUP BY instance_type, gpu_type ORDER BY instance_type, gpu_type""",
    # Did exploration pay for itself? Per rollout iteration: its explored prompts' variance against random seeds'
    # (the same iteration's default-seed prompts, and the running baseline the bandit judges against), the same
    # comparison on exploration's stale, cheap rewards of the same prompts, and what exploring cost (iteration - 1).
    "exploration_payoff": """
        WITH per_iteration AS (
            SELECT iteration, any_value(planner) AS planner,
                   count(*) FILTER (WHERE source = 'explored') AS explored_prompts,
                   count(*) FILTER (WHERE source = 'random') AS random_prompts,
                   avg(trained_variance) FILTER (WHERE source = 'explored') AS explored_variance,
                   avg(trained_variance) FILTER (WHERE source = 'random') AS random_variance,
                   any_value(baseline_variance) AS baseline_variance,
                   avg(stale_variance) FILTER (WHERE source = 'explored') AS explored_stale_variance,
                   avg(stale_default_variance) FILTER (WHERE source = 'explored') AS random_stale_variance
            FROM seed_groups GROUP BY iteration)
        SELECT g.*, g.explored_variance / nullif(g.baseline_variance, 0) AS variance_ratio,
               g.explored_variance > g.baseline_variance AS paid_off, e.arm, e.time_used_s AS explore_s,
               c.usd AS explore_usd
        FROM per_iteration g
        LEFT JOIN exploration e ON e.iteration = g.iteration - 1
        LEFT JOIN cost_per_phase c ON c.iteration = g.iteration - 1 AND c.phase = 'explore'
        ORDER BY g.iteration""",
    # A multi-reward's components: the mean of each over an iteration's requests of one kind (rollout: what the
    # train phase reports as reward/<name>).
    "reward_components": """
        SELECT r.iteration, r.kind, j.key AS component, avg(CAST(j.value AS DOUBLE)) AS mean,
               count(*) AS num_requests
        FROM requests r, json_each(r.reward_components) j
        WHERE r.status = 'done'
        GROUP BY ALL ORDER BY r.iteration, r.kind, component""",
    # Held-out score per validated iteration, with time and money spent so far.
    "validation_curve": f"""
        SELECT v.iteration, v.weights_version, v.reward, v.score,
               max(v.score) OVER (ORDER BY v.iteration) AS best_score,
               v.score - lag(v.score) OVER (ORDER BY v.iteration) AS delta,
               {_SECONDS.format(a="(SELECT min(started_at) FROM runs)", b="v.recorded_at")} AS elapsed_s,
               (SELECT sum(c.usd_total) FROM cost_per_iteration c WHERE c.iteration <= v.iteration) AS cumulative_usd
        FROM validation v ORDER BY v.iteration""",
    # One row per validation with reward-hacking signals: each against the base's (weights version 0), whether
    # the rule flagged it and which test fired, what the run did, and the rollback it caused (if any).
    "reward_hacking": """
        WITH base AS (SELECT * FROM hacking_signals WHERE weights_version = 0)
        SELECT h.iteration, h.weights_version, h.proxy_reward, h.proxy, h.proxy - b.proxy AS proxy_change,
               h.proxy_se, h.gold_reward, h.gold, h.gold - b.gold AS gold_change, h.gold_se,
               h.edge_density, h.edge_density / nullif(b.edge_density, 0) - 1 AS edge_density_change,
               h.colour_entropy, h.colour_entropy / nullif(b.colour_entropy, 0) - 1 AS colour_entropy_change,
               h.saturation, h.saturation / nullif(b.saturation, 0) - 1 AS saturation_change,
               h.compressed_bytes, h.compressed_bytes / nullif(b.compressed_bytes, 0) - 1 AS compressed_bytes_change,
               h.diversity, h.diversity / nullif(b.diversity, 0) - 1 AS diversity_change,
               h.proxy_components, h.flagged, h.rule, h.detail, h.action,
               r.restored_version, r.restored_gold, r.learning_rate AS rollback_learning_rate,
               r.kl_beta AS rollback_kl_beta
        FROM hacking_signals h LEFT JOIN base b ON true LEFT JOIN hacking_rollbacks r ON r.iteration = h.iteration
        ORDER BY h.iteration""",
}


def _user_tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    rows = con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' AND table_type = 'BASE TABLE' "
        "AND table_catalog = current_database()"
    ).fetchall()
    return {r[0] for r in rows}


def stored_version(con: duckdb.DuckDBPyConnection, where: str) -> int | None:
    """Schema version of an open ledger; None for an empty file; error for a foreign one."""
    tables = _user_tables(con)
    if not tables:
        return None
    if "schema_version" not in tables:
        raise LedgerSchemaError(
            f"{where} is a DuckDB file but not a spotlight ledger (no schema_version table; "
            f"it has tables {sorted(tables)}). Point --db at a run's ledger.duckdb."
        )
    version = con.execute("SELECT max(version) FROM schema_version").fetchone()[0]
    if version is None:
        raise LedgerSchemaError(
            f"{where}: schema_version is empty, so the ledger's layout is unknown; refusing to guess"
        )
    return int(version)


def upgrade(con: duckdb.DuckDBPyConnection, where: str) -> int:
    """Bring an open ledger to SCHEMA_VERSION in one transaction; return the version it had (-1 if new)."""
    found = stored_version(con, where)
    if found is not None and found > SCHEMA_VERSION:
        raise LedgerSchemaError(
            f"{where} has ledger schema v{found}, newer than this spotlight understands (v{SCHEMA_VERSION}); "
            "upgrade spotlight to read or write it"
        )
    start = -1 if found is None else found
    if start == SCHEMA_VERSION:
        return start
    con.execute("BEGIN TRANSACTION")
    try:
        for name in VIEWS:
            con.execute(f"DROP VIEW IF EXISTS {name}")
        for version in range(start + 1, SCHEMA_VERSION + 1):
            con.execute(MIGRATIONS[version])
            note = "created" if version == 0 else f"migrated from v{version - 1}"
            con.execute(f"INSERT INTO schema_version VALUES (?, {_NOW}, ?)", [version, note])
        for name, sql in VIEWS.items():
            con.execute(f"CREATE VIEW {name} AS {sql}")
        con.execute("COMMIT")
    except duckdb.Error:
        con.execute("ROLLBACK")  # nothing half-migrated: the file keeps its old version
        raise
    return start
