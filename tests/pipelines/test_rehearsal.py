"""The cloud path rehearsed on this machine: each SkyPilot task built as `spotlight launch` builds it, its `run:` block
executed as SkyPilot would on a node, against the node's own redis-server (TLS with the run's CA, ACL users) and a
moto S3 server. A worker with the wrong password, or without the run's CA, is refused and says why.

Each node is first set up as the YAMLs' `setup:` does, with sky/setup.sh (a stand-in `uv`: no network): the
reserved node installs the environment and caches it in the "bucket", every spot node (a fresh VM) restores it
from there; the seconds each took are reported. One reserved block (Redis, coordinator, trainer, one local worker)
and two spot-worker blocks then run two iterations of preset cpu_smoke in that environment. One spot worker is
SIGTERMed mid-request (a preemption notice) and its block run again, as managed-job recovery does. Parsing the
YAMLs and then executing their run lines is what would have caught a run line that does
nothing.
"""

from __future__ import annotations

import secrets
import shutil
import signal
import socket
from pathlib import Path

import pytest

from tests.paths import REPO_ROOT
from tests.pipelines.sky_blocks import ArgvWatch, Block, start_block, task_env, wait_for
from tests.pipelines.stand_in_uv import install_stand_in_uv, setup_env, setup_report

pytestmark = [
    pytest.mark.nightly,  # the whole node and two spot blocks, 2.5-6 min: make test-all (CI: the print-env test)
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        shutil.which("redis-server") is None,
        reason="redis-server is not installed (apt-get install redis-server); the reserved block starts its own",
    ),
]
RUN_TIMEOUT_S = 240


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tasks(store: str, port: int, run_dir: Path, password: str, home: Path):
    """The reserved task and a spot worker's, as `spotlight launch` builds them (the run's TLS material, the workers'
    ACL user and password, the run's config file), with the envs that make them run here; the config file is put
    where SkyPilot puts a file mount, under the nodes' `home`, with this machine's port and run folder."""
    from pipelines.launch_config import resolve_launch_run
    from resources.cloud import (
        LaunchPlan,
        placed_run_config,
        reserved_task,
        with_env_signing,
        with_run_tls,
        worker_task,
    )
    from resources.cloud.env_pin import make_env_signing
    from resources.queue.redis_tls import make_run_tls
    from resources.settings.resolve import derive, to_yaml

    secrets = with_run_tls(
        {"SPOTLIGHT_REDIS_PASSWORD": password, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"},
        make_run_tls(),
    )
    secrets = with_env_signing(secrets, make_env_signing())  # the reserved node signs the venv it caches
    flags = ["--store", store, "--preset", "cpu_smoke", "--iterations", "2", "--local-workers", "1", "--device", "cpu"]
    plan = LaunchPlan(spot_workers=1, run=resolve_launch_run(None, flags, {}))
    placed = placed_run_config(plan)
    here = {"queue": f"rediss://127.0.0.1:{port}/0", "run_dir": str(run_dir)}  # what this machine's node differs in
    shipped = home / ".spotlight" / "run_config.yaml"
    shipped.parent.mkdir(parents=True, exist_ok=True)
    shipped.write_text(to_yaml(derive(placed, placed.preset, deployment=here)))
    reserved = reserved_task(plan, secrets, shipped)
    # what `sky launch --env` sets (the workers, END_CHECK_S 1, leave well within REVOKE_GRACE_S)
    reserved.update_envs({"RUN_DIR": str(run_dir), "REDIS_PORT": str(port), "REVOKE_GRACE_S": "20"})
    queue = f"rediss://127.0.0.1:{port}/0"  # each worker task adds its own ACL user
    spot_envs = {"USD_PER_HOUR": "0.25", "END_CHECK_S": "1"}
    spot = worker_task(plan, secrets, 1, shipped, queue)
    spot.update_envs(spot_envs)
    wrong_password = worker_task(plan, {**secrets, "SPOTLIGHT_REDIS_PASSWORD": "not-the-run's"}, 2, shipped, queue)
    wrong_password.update_envs(spot_envs)
    no_ca = worker_task(plan, secrets, 3, shipped, queue)
    no_ca.update_envs({**spot_envs, "SPOTLIGHT_REDIS_RUN_CA": ""})
    return reserved, spot, {"wrong password": wrong_password, "no CA": no_ca}, secrets


def _grant(port: int, secrets: dict, *tasks) -> None:
    """What `spotlight launch` does before it submits each worker job: grant that job's ACL user on the node's Redis."""
    from urllib.parse import urlsplit

    from resources.queue.redis_acl import grant_worker_at

    for task in tasks:
        grant_worker_at(f"rediss://127.0.0.1:{port}/0", secrets, urlsplit(task.envs["SPOTLIGHT_QUEUE"]).username)


def _set_up_nodes(tasks: dict, tmp: Path) -> dict[str, dict]:
    """sky/setup.sh (what both YAMLs' setup runs) for each node in turn, as on fresh VMs that share the run's bucket:
    the first installs and caches, the others restore; every run block then uses that venv. What each reported."""
    import os
    import subprocess

    bin_dir, venv = tmp / "uv-bin", tmp / "node-home" / ".spotlight-venv"
    install_stand_in_uv(bin_dir)
    node_envs = {"SPOTLIGHT_VENV": str(venv), "ENV_CACHE_DIR": str(tmp / "bucket" / "env-cache")}
    reports = {}
    for name, task in tasks.items():
        assert "bash sky/setup.sh" in task.setup, f"{name}: the YAML's setup does not run sky/setup.sh"
        task.update_envs(node_envs)
        shutil.rmtree(venv, ignore_errors=True)  # a fresh VM
        report = tmp / f"setup-{name}.json"
        env = setup_env(task_env(task, os.environ), bin_dir, SETUP_REPORT=str(report))
        done = subprocess.run(
            ["bash", "sky/setup.sh"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"{name}'s setup failed: {done.stdout[-2000:]}{done.stderr[-2000:]}"
        reports[name] = setup_report(report)
    print("setup seconds per node:", {name: (r["path"], r["seconds"]) for name, r in reports.items()})
    return reports


def _claimed(block: Block) -> bool:
    return '"event": "claim"' in block.text()


def test_the_yaml_run_blocks_train_two_iterations_through_a_preemption_and_a_recovery(s3_server, tmp_path, monkeypatch):
    import os

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    password = secrets.token_hex(16)
    port, run_dir, logs = _free_port(), tmp_path / "run", tmp_path / "logs"
    home = tmp_path / "node-home"  # every node's home (sky/setup.sh's venv, the run's config file)
    reserved_task, spot_task, refused, launch_secrets = _tasks(
        f"s3://{s3_server.bucket}/spotlight", port, run_dir, password, home
    )
    node_env = {**os.environ, "HOME": str(home)}
    recover_on = list(spot_task.resources)[0].job_recovery["recover_on_exit_codes"]
    setups = _set_up_nodes({"reserved": reserved_task, "spot": spot_task, **refused}, tmp_path)
    assert [r["path"] for r in setups.values()] == ["install"] + ["restore"] * (len(setups) - 1)
    assert len({r["key"] for r in setups.values()}) == 1 and all(r["seconds"] >= 0 for r in setups.values())
    blocks: list[Block] = []
    outsiders: dict[str, Block] = {}
    with ArgvWatch(password.encode()) as argv_watch:
        try:
            blocks.append(reserved := start_block(reserved_task, "reserved", REPO_ROOT, logs, node_env))
            wait_for(lambda: (run_dir / "redis" / "redis.pid").exists(), 30, "redis-server", blocks)
            wait_for(lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0, 30, "redis-server's port", blocks)
            _grant(port, launch_secrets, spot_task, refused["wrong password"])  # only its password is wrong
            outsiders = {
                why: start_block(task, why.replace(" ", "-"), REPO_ROOT, logs, node_env)
                for why, task in refused.items()
            }
            blocks += [start_block(spot_task, f"spot{i}", REPO_ROOT, logs, node_env) for i in (1, 2)]
            wait_for(lambda: any(_claimed(b) for b in blocks[1:]), RUN_TIMEOUT_S, "a spot worker's claim", blocks)
            victim = next(b for b in blocks[1:] if _claimed(b))
            victim.signal(signal.SIGTERM)  # the preemption notice (or SkyPilot stopping the job)
            exit_code = victim.wait(60)
            assert exit_code in recover_on, f"a preempted worker exits {exit_code}; job_recovery recovers {recover_on}"
            blocks.append(start_block(spot_task, f"{victim.name}-recovered", REPO_ROOT, logs, node_env))
            assert reserved.wait(RUN_TIMEOUT_S) == 0, reserved.text()[-3000:]
            assert "revoked 2 worker users" in reserved.text()  # both granted users (spot, wrong password), at the end
            for block in blocks[1:]:  # the run has ended: every live spot job ends by itself, with 0 (not recovered)
                if block is not victim:
                    assert block.wait(60) == 0, block.text()[-3000:]
            for why, block in outsiders.items():  # a worker the run did not set up is refused, saying why
                code = block.wait(60)
                expected = (
                    "rejected the credentials" if why == "wrong password" else "not signed by a CA this process trusts"
                )
                assert code == 2 and expected in block.text(), f"{why}: exit {code}\n{block.text()[-2000:]}"
        finally:
            for block in [*reversed(blocks), *outsiders.values()]:
                block.stop()
            _stop_redis(run_dir)
    assert argv_watch.scans > 10 and not argv_watch.hits, f"the Redis password was on a command line: {argv_watch.hits}"
    _assert_ledger(run_dir / "ledger.duckdb", victim_log=victim.text(), password=password)
    from resources.store import open_store  # the record outlives the node's disk (autostop deletes it)

    archived = open_store(f"s3://{s3_server.bucket}/spotlight").get_bytes(f"archive/{run_dir.name}/ledger.duckdb")
    assert archived == (run_dir / "ledger.duckdb").read_bytes()
    for log in [*logs.glob("*.log"), *run_dir.rglob("*.log"), *run_dir.rglob("*.stderr")]:
        assert password not in log.read_text(errors="replace"), f"the Redis password is in {log}"


def _stop_redis(run_dir: Path) -> None:
    import os

    pidfile = run_dir / "redis" / "redis.pid"
    if pidfile.exists():
        os.kill(int(pidfile.read_text()), signal.SIGTERM)


def _assert_ledger(path: Path, victim_log: str, password: str) -> None:
    import json

    from resources.ledger.db import query_ledger

    def rows(sql: str) -> list[dict]:
        return query_ledger(path, sql).as_dicts()

    requests = rows("SELECT request_id, kind, result_hash FROM requests")
    done = rows("SELECT request_id, count(*) AS n FROM attempts WHERE outcome = 'done' GROUP BY request_id")
    assert len(requests) >= 16 and all(r["result_hash"] for r in requests if r["kind"] == "rollout")
    assert {r["request_id"] for r in done} == {r["request_id"] for r in requests}
    assert all(r["n"] == 1 for r in done), f"requests done more than once: {[r for r in done if r['n'] > 1]}"
    victim_id = next(json.loads(line)["worker_id"] for line in victim_log.splitlines() if '"event": "ready"' in line)
    workers = {r["worker_id"]: r for r in rows("SELECT * FROM workers WHERE role = 'rollout'")}
    remote = {w: r for w, r in workers.items() if not w.startswith("w0")}
    assert len(remote) == 3, f"two spot workers and the recovered one, got {sorted(workers)}"
    assert remote[victim_id]["end_reason"] == "preempted" and remote[victim_id]["usd_per_hour"] == 0.25
    assert all(r["spot"] for r in remote.values())
    (preemption,) = rows("SELECT * FROM preemptions")
    assert preemption["worker_id"] == victim_id and preemption["notice_s"] > 0
    if preemption["request_id"] is not None:  # it was mid-rollout: committed, and resumed from there elsewhere
        committed = next(
            json.loads(line)["committed_step"] for line in victim_log.splitlines() if '"preempted"' in line
        )
        (resumed,) = rows(
            f"SELECT * FROM attempts WHERE request_id = '{preemption['request_id']}' AND outcome = 'done'"
        )
        assert preemption["state_committed"] and preemption["steps_lost"] == 0
        assert resumed["worker_id"] != victim_id and resumed["resumed_from_step"] == committed
    assert rows("SELECT usd_spot FROM run_cost")[0]["usd_spot"] > 0
    tables = [r["table_name"] for r in rows("SELECT table_name FROM information_schema.tables")]
    for table in tables:
        assert password not in repr(rows(f"SELECT * FROM {table}")), f"the Redis password is in ledger table {table}"
