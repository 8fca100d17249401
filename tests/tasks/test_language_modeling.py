"""The language-modeling task: pairs or dict batches, logits as tensors, dicts or objects; a
training_step's dict logs its other values; a Hugging Face model on local text resumes exactly."""
from __future__ import annotations

import csv
import math
from types import SimpleNamespace

import pytest
import torch
from torch.nn import functional as F

from framework.errors import ConfigError
from framework.tasks.language_modeling import LanguageModeling
from tests.conftest import assert_resume_is_exact, run_inprocess
from tests.helpers.text_data import stdlib_documents, write_jsonl

torch.manual_seed(0)
EMBED = torch.nn.Embedding(16, 16)


class Wrapped(torch.nn.Module):
    """Returns its logits the way `kind` says: a tensor, a dict or an object with .logits."""

    def __init__(self, kind):
        super().__init__()
        self.kind, self.embed = kind, EMBED

    def forward(self, input_ids, attention_mask=None):
        logits = self.embed(input_ids)
        return {"tensor": logits, "dict": {"logits": logits}, "object": SimpleNamespace(logits=logits)}[self.kind]


@pytest.mark.parametrize("kind", ["tensor", "dict", "object"])
def test_dict_batches_score_each_position_against_the_next_label_skipping_padding(kind):
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    batch = {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}
    task = LanguageModeling()
    loss = task.training_step(Wrapped(kind), batch)
    logits = EMBED(ids)
    expected = F.cross_entropy(torch.cat([logits[0, :3], logits[1, :1]]), torch.tensor([2, 3, 4, 6]))
    assert torch.allclose(loss, expected)
    sums = task.validation_step(Wrapped(kind), batch)
    assert sums["tokens"].item() == 4 and torch.allclose(sums["loss_sum"].float(), expected * 4)
    metrics = task.compute_metrics(sums)
    assert math.isclose(metrics["perplexity"], math.exp(metrics["loss"]), rel_tol=1e-9)
    assert task.batch_size(batch) == 8


def test_an_output_without_logits_is_refused_by_name():
    class LossOnly(torch.nn.Module):
        def forward(self, input_ids):
            return {"loss": torch.zeros(())}

    with pytest.raises(ConfigError, match="returned a dict without logits"):
        LanguageModeling().training_step(LossOnly(), {"input_ids": torch.zeros(1, 4, dtype=torch.long)})


def hf_on_jsonl(tmp_path) -> list[str]:
    write_jsonl(tmp_path / "text" / "train.jsonl", stdlib_documents(12, max_chars=3000))
    return ["model=hf_causal_lm", "data=text_files", f"data.files={tmp_path}/text/*.jsonl", "data.val_percent=20",
            f"data.cache_dir={tmp_path}/cache", "data.block_size=32", "data.batch_size=4", "model.config.n_layer=1",
            "model.config.n_embd=32", "model.config.n_head=2", "trainer.val_batches=2", "trainer.val_every=4",
            "trainer.log_every=1", "trainer.progress_bar=false", "trainer.plot=false", "strategy=single_device"]


def test_a_training_step_dict_logs_its_other_values(tmp_path, monkeypatch):
    monkeypatch.setenv("FRAMEWORK_TRUST_ALLOW", "tests.helpers.")
    run_inprocess([*hf_on_jsonl(tmp_path), "task._target_=tests.helpers.lm_tasks.LanguageModelingWithAccuracy",
                   "trainer.max_steps=3"], tmp_path / "run")
    rows = [r for r in csv.DictReader(open(tmp_path / "run" / "metrics.csv")) if r.get("train/loss")]
    assert [r["step"] for r in rows] == ["1", "2", "3"]
    assert all(0.0 <= float(r["train/accuracy"]) <= 1.0 for r in rows) and float(rows[0]["train/loss"]) > 4


@pytest.mark.slow
def test_a_hugging_face_model_on_local_text_resumes_exactly(tmp_path):
    assert_resume_is_exact([*hf_on_jsonl(tmp_path), "callbacks.checkpoint.every_n_steps=2"], tmp_path, steps=6)


@pytest.mark.slow
def test_a_steps_loss_is_its_mean_over_every_scored_token_however_the_batch_is_split(tmp_path):
    """Conversations scored on their answers only, padded one a row: ranks and micro-batches hold
    different numbers of scored tokens. The loss of a step is summed over all of them and divided
    by their global count (one all-reduce), so one process, two, and either with accumulation give
    the same first loss and the same weights after the step (averaging each rank's own mean, as
    before, gave 4.7177 on one process and 4.7492 on two)."""
    from tests.conftest import TINY_GPT, checkpoints, load_model_state

    base = [*(o for o in TINY_GPT if not o.startswith(("data.", "model.block_size"))), "data=chat_files",
            "model.block_size=256", "data.packing=false", "data.drop_unscorable=true", "model.dropout=0.0",
            "data.val_batch_size=8", "trainer.max_steps=1", "trainer.val_at_start=false", "trainer.log_every=1",
            "callbacks=[checkpoint]", f"data.cache_dir={tmp_path / 'cache'}"]
    splits = {"one x 8": ["data.batch_size=8"], "two x 4": ["strategy=ddp", "devices=2", "data.batch_size=4"],
              "one x 4 x 2": ["data.batch_size=4", "trainer.accumulate=2"],
              "two x 2 x 2": ["strategy=ddp", "devices=2", "data.batch_size=2", "trainer.accumulate=2"]}
    losses, weights = {}, {}
    for name, split in splits.items():
        out = tmp_path / name.replace(" ", "")
        run_inprocess([*base, *split], out)
        losses[name] = float(next(r for r in csv.DictReader(open(out / "metrics.csv")) if r.get("train/loss"))
                             ["train/loss"])
        weights[name] = load_model_state(checkpoints(out)[-1])
    for name in splits:
        assert losses[name] == pytest.approx(losses["one x 8"], abs=1e-6), (name, losses)
        for key, value in weights["one x 8"].items():
            torch.testing.assert_close(weights[name][key], value, rtol=1e-5, atol=1e-6, msg=f"{name}: {key}")
