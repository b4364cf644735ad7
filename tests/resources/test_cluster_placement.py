"""Where a run's local workers sample: CPU workers on a CPU run, one worker per GPU the trainer leaves on CUDA."""

from __future__ import annotations

import pytest

from resources.cluster.placement import WorkerDevice, local_worker_devices


def test_a_cpu_run_gets_as_many_cpu_workers_as_it_asks_for() -> None:
    assert local_worker_devices("cpu", 1, 3, gpu_count=8) == [WorkerDevice("cpu")] * 3


@pytest.mark.parametrize(
    "device, nproc, expected",
    [
        ("cuda", 1, ["1", "2", "3"]),  # the trainer on GPU 0
        ("cuda:2", 1, ["0", "1", "3"]),  # the trainer on the GPU it names
        ("cuda", 3, ["3"]),  # ranks 0-2 on GPUs 0-2
        ("cuda", 4, []),  # every GPU trains: the trainer samples itself
    ],
)
def test_a_cuda_run_pins_one_worker_to_each_gpu_the_trainer_leaves(device, nproc, expected) -> None:
    plan = local_worker_devices(device, nproc, num_workers=2, gpu_count=4)
    assert [(p.device, p.visible_devices) for p in plan] == [("cuda", g) for g in expected]


def test_a_worker_sees_the_gpu_by_the_name_this_nodes_visible_devices_give_it() -> None:
    """A scheduler that gave this process GPUs 4,6,7 of the node: the worker beside the trainer gets 6, not 1."""
    plan = local_worker_devices("cuda", 1, 2, gpu_count=3, env={"CUDA_VISIBLE_DEVICES": "4,6,7"})
    assert [p.visible_devices for p in plan] == ["6", "7"]


def test_a_one_gpu_machine_whose_trainer_uses_it_has_no_local_worker() -> None:
    assert local_worker_devices("cuda:0", 1, 2, gpu_count=1) == []
