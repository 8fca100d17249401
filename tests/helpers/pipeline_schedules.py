"""Run by tests/construction/test_pipeline_schedules.py in processes forked as the framework's
launcher forks its workers (`run_rank`; or under torchrun: `python pipeline_schedules.py OUT`): the
framework's GPT cut into stages (framework/construction/stages.py, stage_modules.py), one step of
each of torch's pipeline schedules on gloo, its loss and every gradient compared with the
one-process model's. Rank 0 writes one line per schedule to the file `out`: name, loss difference,
largest gradient difference (the tied embedding: its first-stage and last-stage parts summed, as
the pipeline strategy will)."""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.pipelining as pipelining
from torch.nn import functional as F

from framework.construction.stage_modules import model_stages
from framework.construction.stages import balanced_split
from framework.models.gpt import GPT
from framework.strategy.mesh.pipeline.schedules import SCHEDULES, stage_ids, stages_per_rank

MICROBATCHES = 8  # at least every row's minimum at 4 processes (DualPipeV: 8 stages)


def loss_of(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def fresh_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=64, block_size=16, n_layer=8, n_head=2, n_embd=32)


def one_schedule(name: str, rank: int, world: int, x, y, reference: dict, reference_loss: float) -> tuple[float, float]:
    per_rank = stages_per_rank(name, 2)
    count = world * per_rank
    gpt = fresh_gpt()
    parts = model_stages(gpt, balanced_split([sum(p.numel() for p in b.parameters()) for b in gpt.blocks], count))
    ids = stage_ids(name, rank, world, per_rank)
    stages = [pipelining.PipelineStage(parts[i], i, count, torch.device("cpu")) for i in ids]
    schedule_class = getattr(pipelining, SCHEDULES[name].torch_class)
    schedule = schedule_class(stages[0] if per_rank == 1 else stages, n_microbatches=MICROBATCHES, loss_fn=loss_of)
    losses: list = []
    schedule.step(*((x,) if 0 in ids else ()), **({"target": y, "losses": losses} if count - 1 in ids else {}))
    loss = torch.tensor(torch.stack(losses).mean().item() if losses else 0.0)
    dist.all_reduce(loss)  # only the last stage's rank holds it
    worst = torch.tensor(0.0)
    tied = torch.zeros_like(reference["tok_emb.weight"])
    for stage in stages:
        for param_name, param in stage.submod.named_parameters():
            if param_name in ("tok_emb.weight", "head.weight"):
                tied += param.grad
            else:
                worst = torch.maximum(worst, (param.grad - reference[param_name]).abs().max())
    dist.all_reduce(tied)
    worst = torch.maximum(worst, (tied - reference["tok_emb.weight"]).abs().max())
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return abs(loss.item() - reference_loss), worst.item()


def run_rank(rank: int, world: int, port: int, out: str) -> None:
    """One rank, one thread (as the launcher gives 2 processes on 2 cores), meeting on 127.0.0.1:port."""
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    main(out)


def main(out: str) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    data = torch.randint(0, 64, (MICROBATCHES, 17), generator=torch.Generator().manual_seed(1))
    x, y = data[:, :-1], data[:, 1:]
    model = fresh_gpt()
    reference_loss = loss_of(model(x), y)
    reference_loss.backward()
    reference = {name: p.grad for name, p in model.named_parameters()}
    lines = []
    for name in SCHEDULES:
        loss_diff, grad_diff = one_schedule(name, rank, world, x, y, reference, reference_loss.item())
        lines.append(f"{name} {loss_diff:.3e} {grad_diff:.3e}")
    if rank == 0:
        with open(out, "w") as f:
            f.write("\n".join(lines) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
