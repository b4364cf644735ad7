"""sky/setup.sh, the nodes' setup: a pinned Python and venv through uv, built once per version of the pins and
restored from the run's bucket on every later node start and spot recovery (a stand-in `uv` on PATH, no network).
The cache is signed by the reserved node with the run's key (resources/cloud/env_pin.py): a node restores only what
the launcher's public key verifies, and a spot worker never writes it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.paths import REPO_ROOT
from tests.pipelines.stand_in_uv import install_stand_in_uv, setup_env, setup_report


@pytest.fixture
def node(tmp_path: Path):
    """A workdir holding what setup reads (the checkout's pyproject.toml, sky/), a home, a bucket mount."""
    workdir = tmp_path / "sky_workdir"
    (workdir / "sky").mkdir(parents=True)
    for name in ("pyproject.toml", "sky/setup.sh", "sky/constraints.txt"):
        shutil.copy(REPO_ROOT / name, workdir / name)
    from resources.cloud.env_pin import make_env_signing, with_env_signing

    uv_log = install_stand_in_uv(tmp_path / "bin")
    env = setup_env(
        os.environ,
        tmp_path / "bin",
        HOME=str(tmp_path / "home"),
        SPOTLIGHT_VENV=str(tmp_path / "home" / ".spotlight-venv"),
        ENV_CACHE_DIR=str(tmp_path / "bucket" / "env-cache"),
        SETUP_REPORT=str(tmp_path / "setup.json"),
        **with_env_signing({}, make_env_signing()),  # the reserved node: it signs what it caches
    )
    return workdir, env, uv_log, tmp_path


def _spot_worker(env: dict) -> dict:
    """The same node's environment as a spot worker gets it: the launcher's verify key, no signing key."""
    return {**env, "SPOTLIGHT_ENV_SIGNING_KEY": ""}


def _setup(workdir: Path, env: dict) -> tuple[dict, str]:
    done = subprocess.run(["bash", "sky/setup.sh"], cwd=workdir, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return setup_report(Path(env["SETUP_REPORT"])), done.stdout


def _installs(uv_log: Path) -> int:
    return sum(line.startswith("pip install") for line in uv_log.read_text().splitlines())


def test_the_first_node_installs_and_caches_and_a_new_node_restores_instead_of_installing(node) -> None:
    workdir, env, uv_log, tmp = node
    first, log = _setup(workdir, env)
    assert first["path"] == "install" and _installs(uv_log) == 1 and "path install" in log
    (archive,) = (tmp / "bucket" / "env-cache").glob("env-*.tar")
    assert archive.name == f"env-{first['key']}.tar" and not list(archive.parent.glob("*.part-*"))
    assert "python install 3.11" in uv_log.read_text() and "venv --python 3.11" in uv_log.read_text()
    venv = Path(env["SPOTLIGHT_VENV"])
    shutil.rmtree(venv)  # a new VM: a spot recovery, or the next worker
    second, log = _setup(workdir, env)
    assert second["path"] == "restore" and second["key"] == first["key"] and "path restore" in log
    assert _installs(uv_log) == 1, "the second node reinstalled"
    imported = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import yaml; print('ok')"], capture_output=True, text=True, timeout=60
    )
    assert imported.stdout.strip() == "ok", imported.stderr  # the restored venv runs
    third, _ = _setup(workdir, env)  # setup again on the same VM (a relaunch): nothing to do
    assert third["path"] == "present" and _installs(uv_log) == 1
    assert all(isinstance(r["seconds"], float) and r["seconds"] >= 0 for r in (first, second, third))


def test_new_pins_install_again_and_a_broken_cache_is_ignored(node) -> None:
    workdir, env, uv_log, tmp = node
    first, _ = _setup(workdir, env)
    with open(workdir / "sky" / "constraints.txt", "a") as pins:
        pins.write("example-pin==1.0\n")
    changed, _ = _setup(workdir, env)
    assert changed["path"] == "install" and changed["key"] != first["key"] and _installs(uv_log) == 2
    archive = tmp / "bucket" / "env-cache" / f"env-{changed['key']}.tar"
    archive.write_bytes(archive.read_bytes()[:1000])  # cut short (an interrupted upload)
    shutil.rmtree(env["SPOTLIGHT_VENV"])
    again, log = _setup(workdir, env)
    assert again["path"] == "install" and "is unusable or not signed" in log and _installs(uv_log) == 3


def test_without_a_cache_folder_setup_installs_and_stays_idempotent(node) -> None:
    workdir, env, uv_log, _ = node
    env = {**env, "ENV_CACHE_DIR": ""}
    assert _setup(workdir, env)[0]["path"] == "install"
    assert _setup(workdir, env)[0]["path"] == "present" and _installs(uv_log) == 1


def _plant(archive: Path, venv: Path, tmp: Path) -> None:
    """What a compromised spot VM could write to the bucket: a venv of the right key (its key file copied) holding
    its own code, tarred over the cached archive."""
    import tarfile

    planted = tmp / "planted" / venv.name
    shutil.copytree(venv, planted, symlinks=True)
    (planted / "bin" / "python-planted").write_text("#!/bin/sh\necho owned\n")
    with tarfile.open(archive, "w") as tar:
        tar.add(planted, arcname=venv.name)


def test_a_spot_worker_restores_the_signed_cache_and_never_writes_the_cache(node) -> None:
    workdir, env, uv_log, tmp = node
    first, _ = _setup(workdir, env)  # the reserved node installs, signs and saves
    cache = tmp / "bucket" / "env-cache"
    assert sorted(p.name for p in cache.iterdir()) == [f"env-{first['key']}.tar", f"env-{first['key']}.tar.sig"]
    shutil.rmtree(env["SPOTLIGHT_VENV"])
    worker, log = _setup(workdir, _spot_worker(env))
    assert worker["path"] == "restore" and _installs(uv_log) == 1, log
    with open(workdir / "sky" / "constraints.txt", "a") as pins:
        pins.write("example-pin==1.0\n")  # new pins: the worker installs, and writes nothing to the bucket
    before = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    changed, log = _setup(workdir, _spot_worker(env))
    assert changed["path"] == "install" and "saved" not in log
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == before


@pytest.mark.parametrize("signature", ["kept", "the_planters_own_key"])
def test_a_planted_archive_with_the_right_key_but_other_contents_is_refused(node, signature) -> None:
    from resources.cloud.env_pin import make_env_signing

    workdir, env, uv_log, tmp = node
    first, _ = _setup(workdir, env)
    archive = tmp / "bucket" / "env-cache" / f"env-{first['key']}.tar"
    venv = Path(env["SPOTLIGHT_VENV"])
    _plant(archive, venv, tmp)
    if signature == "the_planters_own_key":  # signed, but not with the run's key (a worker never holds that)
        key = tmp / "planter.key"
        key.write_bytes(make_env_signing().signing_pem)
        signed = ["openssl", "dgst", "-sha256", "-sign", str(key), "-out", f"{archive}.sig", str(archive)]
        subprocess.run(signed, check=True, capture_output=True)
    shutil.rmtree(venv)
    refused, log = _setup(workdir, _spot_worker(env))
    assert refused["path"] == "install" and "not signed by this run's launcher: installing" in log
    assert _installs(uv_log) == 2 and not (venv / "bin" / "python-planted").exists()
    shutil.rmtree(venv)
    reserved, _ = _setup(workdir, env)  # the reserved node refuses it too, and signs a fresh one over it
    assert reserved["path"] == "install" and not (venv / "bin" / "python-planted").exists()
    shutil.rmtree(venv)
    assert _setup(workdir, _spot_worker(env))[0]["path"] == "restore"


def test_without_the_launchers_verify_key_the_cache_is_not_read(node) -> None:
    workdir, env, uv_log, _ = node
    _setup(workdir, env)
    shutil.rmtree(env["SPOTLIGHT_VENV"])
    unkeyed, log = _setup(workdir, {**env, "SPOTLIGHT_ENV_VERIFY_KEY": "", "SPOTLIGHT_ENV_SIGNING_KEY": ""})
    assert unkeyed["path"] == "install" and "no SPOTLIGHT_ENV_VERIFY_KEY" in log and _installs(uv_log) == 2
