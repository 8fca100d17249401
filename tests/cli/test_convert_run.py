"""`framework convert RUN OUT --to run`: a run's model as a plain run directory (an adapter run's
adapters merged in), which a distillation takes as its teacher and preference tuning as its
reference: a LoRA-trained built-in GPT can be either (--to hf refuses the built-in GPT)."""
from __future__ import annotations

import json

import torch

from framework.generation.load import load_model
from tests.conftest import TINY_GPT
from tests.helpers.in_process import run_command


def test_a_lora_trained_gpt_becomes_a_plain_run_that_teaches(tmp_path):
    tiny = [*TINY_GPT, "trainer.val_batches=1"]
    lora = tmp_path / "lora"
    trained = run_command(["train", *tiny, "adapter=lora", "adapter.r=4", "optimizer.lr=0.01", "trainer.max_steps=3",
                           "trainer.val_every=3", f"hydra.run.dir={lora}"], tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    refused = run_command(["train", *tiny, "task=distillation", f"task.teacher={lora}"], tmp_path)
    assert refused.returncode == 2 and f"framework convert {lora} merged --to run" in refused.stderr

    merged = tmp_path / "merged"
    converted = run_command(["convert", str(lora), str(merged), "--to", "run"], tmp_path)
    assert converted.returncode == 0, converted.stderr[-3000:]
    meta = json.loads(next((merged / "checkpoints").glob("step_*/meta.json")).read_text())
    assert meta["step"] == 3 and meta["config"]["adapter"] is None and meta["weights_only"]
    adapted, plain = load_model(lora, "test"), load_model(merged, "test")
    assert not any("lora_" in name for name in plain.model.state_dict())
    ids = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(plain.model(ids), adapted.model(ids), atol=1e-5, rtol=1e-5)  # what it computes
    from framework.adapter.lora import base_name

    frozen = {base_name(n): v for n, v in adapted.model.state_dict().items() if "lora_" not in n}
    changed = [n for n, v in plain.model.state_dict().items() if not torch.equal(v, frozen[n])]
    assert changed and all(n.endswith(".weight") and n.startswith("blocks.") for n in changed)  # the adapted layers
    student = run_command(["train", *tiny, "task=distillation", f"task.teacher={merged}", "trainer.max_steps=2",
                           "trainer.val_every=2", f"hydra.run.dir={tmp_path / 'student'}"], tmp_path)
    assert student.returncode == 0, student.stderr[-3000:]
    assert run_command(["convert", str(lora), str(merged), "--to", "run"], tmp_path).returncode == 2  # not empty
