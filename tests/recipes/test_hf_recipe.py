"""Bring your own model and data, as a user does it: the built-in Hugging Face recipe under the
sharding strategies, and a user's 9-line recipe training a pretrained GPT-2 directory on their
JSON lines with their tokenizer at fsdp, exported back to a from_pretrained directory."""
from __future__ import annotations

import csv
import textwrap

import pytest
import torch

from tests.cli.helpers import framework_cmd
from tests.helpers.in_process import run_command
from tests.helpers.text_data import stdlib_documents, train_tokenizer, write_jsonl

pytest.importorskip("transformers")

FEW_STEPS = ["trainer.max_steps=2", "trainer.val_every=2", "trainer.log_every=1", "trainer.progress_bar=false",
             "trainer.plot=false", "data.cache_dir=cache"]


def val_losses(run_dir) -> dict[str, float]:
    with open(run_dir / "metrics.csv") as f:
        return {r["step"]: float(r["val/loss"]) for r in csv.DictReader(f) if r.get("val/loss")}


@pytest.mark.slow
def test_the_hf_recipe_starts_from_the_same_weights_at_fsdp_and_zero3(tmp_path):
    """Both build the model without any rank holding all of it, from the same initialisation."""
    first = {}
    for strategy in ("fsdp", "deepspeed_stage_3"):
        # through the command's own entry in this process (the strategy sets DS_ACCELERATOR for DeepSpeed)
        result = run_command(["run", "hf_gpt2_text", f"name={strategy}", f"strategy={strategy}", "devices=2",
                              "model.config.n_layer=2", "model.config.n_embd=64", *FEW_STEPS, "trainer.val_batches=2"],
                             tmp_path)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        losses = val_losses(tmp_path / "outputs" / strategy)
        first[strategy] = losses["0"]
        assert losses["2"] < losses["0"] < 5.7  # ln(256) = 5.55: a sane random init, then learning
    assert first["fsdp"] == pytest.approx(first["deepspeed_stage_3"], abs=1e-4)


USER_RECIPE = """\
defaults:
  - train
  - override model: hf_causal_lm
  - override data: text_files
  - override strategy: fsdp
  - _self_
devices: 2
model: {pretrained: ./gpt2-small, config: null}
data: {files: "corpus/*.jsonl", tokenizer: ./gpt2-small}
"""


@pytest.mark.slow
def test_a_pretrained_model_on_your_jsonl_with_your_tokenizer_at_fsdp_then_exported(tmp_path):
    from transformers import AutoModelForCausalLM

    from framework.data.text_files import TextFiles
    from framework.models.hf_causal_lm import causal_lm
    from framework.tasks.language_modeling import LanguageModeling

    texts = stdlib_documents(30, max_chars=2000)
    write_jsonl(tmp_path / "corpus" / "part.jsonl", texts)
    train_tokenizer(tmp_path / "gpt2-small", texts, vocab_size=300)
    torch.manual_seed(7)
    pretrained = causal_lm(config={"model_type": "gpt2", "vocab_size": 300, "n_positions": 128, "n_embd": 32,
                                   "n_layer": 2, "n_head": 2})
    pretrained.save_pretrained(tmp_path / "gpt2-small")
    (tmp_path / "recipe.yaml").write_text(USER_RECIPE)
    assert len(USER_RECIPE.splitlines()) <= 15

    result = framework_cmd("run", "recipe.yaml", "name=mine", *FEW_STEPS, "trainer.val_batches=null",
                           cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "sharding units: 2 x GPT2Block" in result.stdout

    # the run's first validation saw exactly the pretrained weights (loaded into each rank's shards)
    data = TextFiles(files=str(tmp_path / "corpus" / "*.jsonl"), tokenizer=str(tmp_path / "gpt2-small"),
                     cache_dir=str(tmp_path / "cache"))
    pretrained.eval()
    sums = [LanguageModeling().validation_step(pretrained, {"input_ids": row["input_ids"][None]})
            for row in data.val_dataset()]
    expected = sum(s["loss_sum"] for s in sums) / sum(s["tokens"] for s in sums)
    assert val_losses(tmp_path / "outputs" / "mine")["0"] == pytest.approx(expected.item(), abs=1e-4)

    # the checkpoint back to a directory transformers loads, with the tokenizer beside it
    checkpoint = tmp_path / "outputs" / "mine" / "checkpoints" / "step_000002"
    result = framework_cmd("convert", str(checkpoint), "exported", "--to", "hf", cwd=tmp_path, in_process=True)
    assert result.returncode == 0, result.stderr
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "exported")
    assert (tmp_path / "exported" / "tokenizer.json").is_file()
    from tests.conftest import load_model_state

    trained = load_model_state(checkpoint)
    for name, value in exported.state_dict().items():
        assert torch.equal(value, trained[name]), name
    assert not torch.equal(exported.transformer.h[0].mlp.c_fc.weight, pretrained.transformer.h[0].mlp.c_fc.weight)
    refused = framework_cmd("convert", str(checkpoint), "exported", "--to", "hf", cwd=tmp_path, in_process=True)
    assert refused.returncode == 2 and "exists and is not empty" in refused.stderr


@pytest.mark.slow
def test_your_own_module_beside_the_recipe_is_importable(tmp_path):
    """A recipe's folder is on the import path of `framework run` and of every process it starts;
    the trust rules still decide what may be built."""
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "tiny_lm.py").write_text(textwrap.dedent("""\
        import torch

        class TinyLM(torch.nn.Module):
            def __init__(self, vocab_size=256, dim=32):
                super().__init__()
                self.embed, self.head = torch.nn.Embedding(vocab_size, dim), torch.nn.Linear(dim, vocab_size)

            def forward(self, tokens):
                return self.head(self.embed(tokens))
        """))
    (tmp_path / "proj" / "recipe.yaml").write_text("defaults:\n  - train\n  - override model: null\n  - _self_\n"
                                                   "model:\n  _target_: tiny_lm.TinyLM\n  dim: 64\n"
                                                   "data:\n  block_size: 64\n  max_bytes: 200000\n")
    args = ("run", "proj/recipe.yaml", "name=own", "strategy=ddp", "devices=2", *FEW_STEPS[:-1], "trainer.val_batches=1")
    refused = framework_cmd(*args, cwd=tmp_path, in_process=True)
    assert refused.returncode == 2 and "trust.allow=[tiny_lm.]" in refused.stderr
    assert not (tmp_path / "outputs").exists()  # refused before anything is written
    result = framework_cmd(*args, "trust.allow=[tiny_lm.]", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert set(val_losses(tmp_path / "outputs" / "own")) == {"0", "2"}
    typo = framework_cmd(*args, "model._target_=tiny_lm.TinyLN", "trust.allow=[tiny_lm.]", cwd=tmp_path, in_process=True)
    assert typo.returncode == 2 and "the module 'tiny_lm' has no 'TinyLN'. Did you mean TinyLM?" in typo.stderr
