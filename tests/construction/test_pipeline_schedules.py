"""Every pipeline schedule torch offers runs the framework's GPT stages on gloo at 2 and 4
processes and gives the one-process loss and gradients (PyTorch's own multi-process pipelining
tests are NCCL-only, and gloo's batch_isend_irecv has hung in older versions: what strategy=pipeline
will offer is checked here). One group of processes per world size runs every schedule, forked from
the framework's forkserver as its launcher forks workers (no interpreter started per rank)."""
from __future__ import annotations

import multiprocessing

import pytest

from framework.strategy.mesh.pipeline.schedules import SCHEDULES

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("processes", [2, 4])
def test_every_schedule_gives_the_one_process_loss_and_gradients(tmp_path, processes):
    from framework.launch.elastic import start_forkserver
    from tests.helpers.pipeline_schedules import run_rank
    from tests.helpers.torchrun import free_port

    start_forkserver()
    context, port, out = multiprocessing.get_context("forkserver"), free_port(), tmp_path / "schedules.txt"
    ranks = [context.Process(target=run_rank, args=(rank, processes, port, str(out))) for rank in range(processes)]
    for rank in ranks:
        rank.start()
    for rank in ranks:
        rank.join(timeout=300)
    assert [rank.exitcode for rank in ranks] == [0] * processes
    lines = [line.split() for line in out.read_text().splitlines() if line]
    rows = {name: (float(loss), float(grad)) for name, loss, grad in lines}
    assert sorted(rows) == sorted(SCHEDULES)
    for name, (loss_diff, grad_diff) in rows.items():
        # the microbatches' mean losses averaged (equal token counts) and their gradients scaled by
        # the schedule: the one-process numbers within float32 rounding (measured: 0 and <= 3e-8)
        assert loss_diff <= 1e-6 and grad_diff <= 1e-6, (name, loss_diff, grad_diff)
