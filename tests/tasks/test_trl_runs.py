"""Whole runs against trl 1.16 with trl's own tokenisation (nothing bypassed): a tiny Llama saved with
a tokenizer shaped like a real family's (tests/helpers/families.py), the same rows, optimizer (AdamW
with weight decay, biases and norms left out as transformers' Trainer does), clipping and constant
LR, float32; 5 steps, in one process and under fsdp at 2 processes.

- SFT (data=chat_files) against SFTTrainer with assistant_only_loss, the chat template marking the
  assistant's text with {% generation %} blocks that leave the end-of-turn token out (not the span
  the framework finds by rendering prefixes);
- DPO (task=preference on text pairs) against DPOTrainer with a tokenizer that adds a bos (Llama 2's
  shape), one whose eos is not a usual name (Llama 3's <|eot_id|>), and a GPT-2 with its dropout 0.1
  (both turn it off by default).
"""
from __future__ import annotations

import json
import math

import pytest
import torch

from tests.conftest import metric_values, run_inprocess
from tests.helpers.families import LLAMA3_TEMPLATE, make_family

transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

# a weight decay large enough that decaying the norms' weights too would show beyond 1e-5 in 5 steps
STEPS, ROWS, BLOCK, LR, DECAY = 5, 4, 256, 1e-3, 0.5
MARKED = LLAMA3_TEMPLATE.replace(
    "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}",
    "'<|end_header_id|>\n\n' }}{% if message['role'] == 'assistant' %}{% generation %}"
    "{{ message['content'] | trim }}{% endgeneration %}{% else %}{{ message['content'] | trim }}{% endif %}"
    "{{ '<|eot_id|>' }}")
QUESTIONS = ["What does json.dumps do?", "What is os.getcwd for?", "Name a sorting function.", "What is a set?",
             "How do I open a file?", "What does len return?", "What is a tuple?", "How do I join paths?"]
ANSWERS = ["It turns an object into a JSON string.", "It gives the current working directory.",
           "sorted(iterable, key=None, reverse=False)", "An unordered collection of unique items.",
           "With open(path) as f: ...", "The number of items in a container.", "An immutable sequence.",
           "os.path.join(a, b) or pathlib's / operator."]
COMMON = ["model=hf_causal_lm", "model.config=null", "data.shuffle=false", f"data.block_size={BLOCK}",
          f"optimizer.lr={LR}", "optimizer.betas=[0.9,0.999]", f"optimizer.weight_decay={DECAY}",
          "scheduler=constant", "trainer.clip_grad_norm=1.0",
          f"trainer.max_steps={STEPS}", "trainer.log_every=1", f"trainer.val_every={STEPS}", "trainer.val_batches=1",
          "trainer.progress_bar=false", "trainer.plot=false", "trainer.val_at_start=false", "seed=0"]
LAYOUTS = {"one_process": [f"data.batch_size={ROWS}"],
           "fsdp_2_processes": ["strategy=fsdp", "devices=2", f"data.batch_size={ROWS // 2}"]}
TRAINING = {"use_cpu": True, "report_to": [], "per_device_train_batch_size": ROWS, "max_steps": STEPS,
            "logging_steps": 1, "learning_rate": LR, "lr_scheduler_type": "constant", "warmup_steps": 0,
            "max_grad_norm": 1.0, "max_length": BLOCK, "save_strategy": "no", "train_sampling_strategy": "sequential",
            "bf16": False, "gradient_checkpointing": False, "optim": "adamw_torch", "weight_decay": DECAY, "seed": 0}


def _model_with(tokenizer_dir, out, gpt2: bool = False):
    """A tiny Llama, or with `gpt2` a tiny GPT-2 with its default dropout 0.1 (the shipped hf_dpo_chat
    recipe's model), saved beside the family's tokenizer files (one directory, as on the Hub)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    torch.manual_seed(0)
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    if gpt2:
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=len(tokenizer), n_positions=512, n_embd=32, n_layer=2, n_head=2, **ids))
        assert model.config.resid_pdrop == model.config.attn_pdrop == 0.1
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
            pad_token_id=tokenizer.pad_token_id, **ids))
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (tokenizer_dir / name).is_file():
            (out / name).write_bytes((tokenizer_dir / name).read_bytes())
    return out


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _history(trainer) -> list[dict]:
    trainer.train()
    return [h for h in trainer.state.log_history if "loss" in h]


def _ours(prepared, tmp_path, layout, overrides: list[str], keys: list[str]):
    """Our run on the prepared model and files (one layout of LAYOUTS), its steps equal trl's."""
    model, files, val, theirs = prepared
    run = tmp_path / layout
    run_inprocess([*COMMON, f"model.pretrained={model}", f"data.files={files}", f"data.val_files={val}",
                   f"data.cache_dir={tmp_path / 'cache'}", *overrides, *LAYOUTS[layout]], run)
    _assert_steps(run, theirs, keys)
    return run


def _assert_steps(run, theirs, keys):
    assert len(theirs) == STEPS
    for key in keys:
        torch.testing.assert_close(torch.tensor(metric_values(run, f"train/{key}")),
                                   torch.tensor([float(h[key]) for h in theirs], dtype=torch.float32),
                                   rtol=0, atol=1e-5, msg=key)


# ---- SFT ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    family = make_family("llama3", root / "tokenizer")
    config = json.loads((family / "tokenizer_config.json").read_text())
    (family / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": MARKED}))
    model = _model_with(family, root / "model")
    conversations = [[{"role": "user", "content": q}, {"role": "assistant", "content": a},
                      {"role": "user", "content": "And briefly?"}, {"role": "assistant", "content": a.split()[0]}]
                     for q, a in zip(QUESTIONS * 3, ANSWERS * 3)][:ROWS * STEPS]
    files = _jsonl(root / "chat.jsonl", [{"messages": c} for c in conversations])
    val = _jsonl(root / "val.jsonl", [{"messages": c} for c in conversations[:2]])
    settings = trl.SFTConfig(output_dir=str(root / "trl"), assistant_only_loss=True, packing=False, **TRAINING)
    trainer = trl.SFTTrainer(model=transformers.AutoModelForCausalLM.from_pretrained(model), args=settings,
                             processing_class=transformers.AutoTokenizer.from_pretrained(str(model)),
                             train_dataset=datasets.Dataset.from_list([{"messages": c} for c in conversations]))
    return model, files, val, _history(trainer)


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_sft_gives_trls_sft_trainer_losses(sft, tmp_path, layout):
    run = _ours(sft, tmp_path, layout, ["data=chat_files", "data.chat_template=null", "data.packing=false"], ["loss"])
    assert metric_values(run, "train/loss")[-1] < metric_values(run, "train/loss")[0]


# ---- DPO ----------------------------------------------------------------------------------------------
def _pairs() -> list[dict]:
    return [{"prompt": f"Q: {q}\nA:", "chosen": f" {a}", "rejected": f" {ANSWERS[(i + 3) % len(ANSWERS)]}"}
            for i, (q, a) in enumerate(zip(QUESTIONS * 3, ANSWERS * 3))][:ROWS * STEPS]


@pytest.fixture(scope="module", params=["llama2", "llama3", "gpt2"])
def dpo(request, tmp_path_factory):
    """llama2: a bos added to every text; llama3: the eos <|eot_id|>, no usual name; gpt2: a GPT-2
    with dropout 0.1, which trl's DPOTrainer turns off (disable_dropout) and task.disable_dropout too."""
    root = tmp_path_factory.mktemp(f"dpo_{request.param}")
    model = _model_with(make_family(request.param, root / "tokenizer"), root / "model", gpt2=request.param == "gpt2")
    files, val = _jsonl(root / "pairs.jsonl", _pairs()), _jsonl(root / "val.jsonl", _pairs()[:2])
    settings = trl.DPOConfig(output_dir=str(root / "trl"), beta=0.1, loss_type=["sigmoid"], **TRAINING)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model))
    trainer = trl.DPOTrainer(model=transformers.AutoModelForCausalLM.from_pretrained(model),
                             ref_model=transformers.AutoModelForCausalLM.from_pretrained(model), args=settings,
                             processing_class=tokenizer, train_dataset=datasets.Dataset.from_list(_pairs()))
    first = trainer.train_dataset[0]
    if request.param == "llama2":
        assert first["prompt_ids"][0] == tokenizer.bos_token_id  # what trl feeds: the family's bos first
    assert first["chosen_ids"][-1] == tokenizer.eos_token_id
    return model, files, val, _history(trainer)


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_dpo_gives_trls_dpo_trainer_losses_with_its_own_tokenisation(dpo, tmp_path, layout):
    run = _ours(dpo, tmp_path, layout, ["task=preference", "data=preference_files"],
                ["loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"])
    assert metric_values(run, "train/loss")[0] == pytest.approx(math.log(2), abs=1e-6)
