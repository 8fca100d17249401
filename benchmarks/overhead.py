"""Per-step overhead, side by side: the same model, data, optimizer, LR schedule, clipping and
batch size trained by (a) a hand-written PyTorch loop, (b) this framework with its defaults
(progress output, CSV logger, LR monitor, a checkpoint at the end) and (c) PyTorch Lightning
(progress bar, CSV logger), on one process.

Steady-state time per step is measured by difference: each trainer runs N1 and N2 steps (fresh
model each time), and (T(N2) - T(N1)) / (N2 - N1) removes start-up, set-up and the final
checkpoint, which all runs pay once. Rounds interleave a b c a b c ...; the ratios are paired
(each round's time over the raw loop's in the same round), medians over ROUNDS.
Validation is off for all three (it is not per-step work).

    .venv-bench/bin/python benchmarks/overhead.py      (`make bench` installs Lightning there; ~8 min)
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from results_table import publish  # benchmarks/ is on sys.path when a script runs
from torch.nn import functional as F

import framework
from framework.config.build import build
from framework.models.build import build_model
from framework.scheduler.cosine import warmup_cosine

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 5
CASES = {
    # name: (overrides, N1, N2)
    "tiny MLP (digits, batch 64)": (["model=mlp", "data=digits", "task=classification"], 200, 1200),
    "default GPT (stdlib text, batch 32)": ([], 10, 40),
}
# Validation and periodic checkpoints are not per-step work: off here (the checkpoint at the end
# is written by both runs of a pair, so it cancels out of the difference).
COMMON = ["trainer.val_at_start=false", "trainer.val_every=1000000", "callbacks.checkpoint.every_n_steps=1000000",
          "seed=0"]


def compose_cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return compose(config_name="train", overrides=[*overrides, *COMMON])


def loss_of(cfg, model, batch) -> torch.Tensor:
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits.flatten(0, -2).float(), y.flatten())


def raw_loop(cfg, steps: int):
    """A hand-written loop (DataLoader, forward, backward, clip, step, schedule) as a generator that
    yields after each optimizer step: benchmarks/step_overhead.py runs it in blocks between the
    framework's steps."""
    torch.manual_seed(cfg.seed)
    data = build(cfg.data, "data")
    model = build_model(cfg.model)
    optimizer = build(cfg.optimizer, "optimizer")(model.parameters())
    scheduler = warmup_cosine(optimizer, steps, cfg.scheduler.warmup_steps, cfg.scheduler.min_lr_ratio)
    loader = torch.utils.data.DataLoader(data.train_dataset(), batch_size=cfg.data.batch_size, shuffle=True,
                                         drop_last=True)
    max_norm = cfg.trainer.clip_grad_norm  # read once: a config lookup costs microseconds a step
    model.train()
    step = 0
    while step < steps:
        for batch in loader:
            loss = loss_of(cfg, model, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            optimizer.step()
            scheduler.step()
            step += 1
            yield step
            if step == steps:
                return


def run_raw(cfg, steps: int) -> float:
    """The hand-written loop run to its end: seconds, set-up included."""
    start = time.perf_counter()
    for _ in raw_loop(cfg, steps):
        pass
    return time.perf_counter() - start


def run_framework(cfg, steps: int) -> float:
    from omegaconf import OmegaConf

    cfg = OmegaConf.merge(cfg, {"trainer": {"max_steps": steps}})
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        framework.run(cfg, output_dir=Path(out) / "run")
        return time.perf_counter() - start


def run_lightning(cfg, steps: int) -> float:
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    class Module(L.LightningModule):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def training_step(self, batch, batch_idx):
            loss = loss_of(cfg, self.model, batch)
            self.log("train/loss", loss)
            return loss

        def configure_optimizers(self):
            optimizer = build(cfg.optimizer, "optimizer")(self.parameters())
            scheduler = warmup_cosine(optimizer, steps, cfg.scheduler.warmup_steps, cfg.scheduler.min_lr_ratio)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        torch.manual_seed(cfg.seed)
        data = build(cfg.data, "data")
        loader = torch.utils.data.DataLoader(data.train_dataset(), batch_size=cfg.data.batch_size, shuffle=True,
                                             drop_last=True)
        trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=CSVLogger(out),
                            enable_checkpointing=False, limit_val_batches=0, num_sanity_val_steps=0,
                            gradient_clip_val=cfg.trainer.clip_grad_norm, log_every_n_steps=cfg.trainer.log_every,
                            enable_model_summary=False, default_root_dir=out)
        trainer.fit(Module(build_model(cfg.model)), loader)
        return time.perf_counter() - start


TRAINERS = {"raw PyTorch loop": run_raw, "this framework": run_framework, "Lightning": run_lightning}


def rows(case: str, per_step: dict[str, list[float]]) -> list[str]:
    """Table rows: the median time per step, and the median over rounds of the ratio to the raw
    loop of the same round (a paired ratio: both ran back to back, under the same machine load)."""
    raw = per_step["raw PyTorch loop"]
    out = []
    for name, values in per_step.items():
        ratio = statistics.median(v / r for v, r in zip(values, raw))
        out.append(f"| {case} | {name} | {statistics.median(values) * 1000:.2f} | {ratio:.3f} |")
    return out


def main() -> None:
    import logging
    import warnings

    import lightning  # noqa: F401  (fail early, before minutes of measuring, if it is missing)

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    lines = [f"{ROUNDS} interleaved rounds per case, medians; torch {torch.__version__}, "
             f"lightning {lightning.__version__}, {torch.get_num_threads()} threads.", "",
             "| case | trainer | ms per step (median) | ratio to the raw loop (median of per-round ratios) |", "|---|---|---|---|"]
    for case, (overrides, n1, n2) in CASES.items():
        cfg = compose_cfg(overrides)
        per_step = {name: [] for name in TRAINERS}
        for _ in range(ROUNDS):
            for name, fn in TRAINERS.items():
                t1, t2 = fn(cfg, n1), fn(cfg, n2)
                per_step[name].append((t2 - t1) / (n2 - n1))
            print(case, {k: f"{v[-1] * 1000:.2f} ms" for k, v in per_step.items()}, file=sys.stderr, flush=True)
        lines += rows(case, per_step)
    publish("overhead", lines)


if __name__ == "__main__":
    main()
