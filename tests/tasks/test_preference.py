"""Preference tuning (task=preference, data=preference_files): the losses as their formulas say, the
pairs read as trl reads them, every bad input refused before launch naming the key (and the file and
line), and whole runs: against trl 1.16's DPOTrainer on the same model, token ids and batches (one
process, fsdp at 2 processes, LoRA with the adapters off as the reference), under ddp, fsdp,
deepspeed_stage_3 and model_parallel at 2 processes as one process, resumed sample-exact, tested on
held-out pairs."""
from __future__ import annotations

import json
import math
import re

import pytest
import torch
from torch import nn

from framework.config.resolvers import example_data
from framework.data.preference_files import PairCollate, PreferenceFiles
from framework.errors import ConfigError
from framework.tasks.preference import Preference, sequence_logps
from framework.tasks.second_model import Frozen
from tests.conftest import checkpoint_at, load_model_state, metric_values, run_inprocess
from tests.helpers.layouts import FOUR_LOGGED_STEPS, ONE_PROCESS, TWO_LAYER_GPT, TWO_PROCESS_LAYOUTS
from tests.helpers.run_cache import trained_run

VOCAB = 11


class FixedLogits(nn.Module):
    """A model whose logits are a table indexed by token (and a scale that trains)."""

    def __init__(self, seed: int):
        super().__init__()
        self.table = nn.Parameter(torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(seed)))

    def forward(self, input_ids, attention_mask=None):
        return self.table[input_ids]


def _batch():
    """Two pairs: prompt lengths 2 and 1, responses of 3/1 and 2/2 tokens (padding after)."""
    pairs = [{"prompt_ids": torch.tensor([1, 2]), "chosen_ids": torch.tensor([3, 4, 5]), "rejected_ids": torch.tensor([6])},
             {"prompt_ids": torch.tensor([7]), "chosen_ids": torch.tensor([8, 9]), "rejected_ids": torch.tensor([10, 1])}]
    return pairs, PairCollate(pad_id=0, block_size=16)(pairs)


def _by_hand(model, pairs) -> tuple[list[float], list[int]]:
    """Each sequence's log-probability of its response tokens, computed token by token."""
    sums, counts = [], []
    for which in ("chosen_ids", "rejected_ids"):
        for pair in pairs:
            ids = torch.cat([pair["prompt_ids"], pair[which]])
            logp = model.table[ids[:-1]].detach().log_softmax(-1)
            start = len(pair["prompt_ids"])
            sums.append(sum(float(logp[t - 1, ids[t]]) for t in range(start, len(ids))))
            counts.append(len(ids) - start)
    return sums, counts


def test_a_batch_holds_the_chosen_then_the_rejected_and_scores_the_responses_alone():
    pairs, batch = _batch()
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5], [7, 8, 9, 0, 0], [1, 2, 6, 0, 0], [7, 10, 1, 0, 0]]
    assert batch["labels"].tolist() == [[-100, -100, 3, 4, 5], [-100, 8, 9, -100, -100], [-100, -100, 6, -100, -100],
                                        [-100, 10, 1, -100, -100]]
    assert batch["attention_mask"].sum(1).tolist() == [5, 3, 3, 3]
    model = FixedLogits(0)
    logps, counts = sequence_logps(model, batch)
    sums, want = _by_hand(model, pairs)
    assert counts.tolist() == want == [3, 2, 1, 2]
    torch.testing.assert_close(logps, torch.tensor(sums), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("loss,smoothing", [("sigmoid", 0.0), ("sigmoid", 0.2), ("ipo", 0.0), ("simpo", 0.0),
                                            ("simpo", 0.1)])
def test_each_loss_and_the_logged_values_are_their_formulas(loss, smoothing):
    pairs, batch = _batch()
    policy, reference = FixedLogits(0), FixedLogits(1)
    beta, gamma = 0.3, 0.7
    task = Preference(loss=loss, beta=beta, label_smoothing=smoothing, simpo_gamma=gamma)
    if loss != "simpo":
        task.use_frozen(Frozen("task.reference", reference))
    out = task.training_step(policy, batch)
    pi, n = _by_hand(policy, pairs)
    rho, _ = _by_hand(reference, pairs)
    want, rewards = [], []
    for i in range(2):  # pair i: chosen is sequence i, rejected is sequence 2 + i
        c, r = i, 2 + i
        if loss == "simpo":
            margin = beta * (pi[c] / n[c] - pi[r] / n[r]) - gamma
            value = -(1 - smoothing) * math.log(1 / (1 + math.exp(-margin))) - smoothing * math.log(
                1 / (1 + math.exp(margin)))
            rewards.append((beta * pi[c] / n[c], beta * pi[r] / n[r]))
        elif loss == "ipo":
            value = ((pi[c] - rho[c]) / n[c] - (pi[r] - rho[r]) / n[r] - 1 / (2 * beta)) ** 2
            rewards.append((beta * (pi[c] - rho[c]), beta * (pi[r] - rho[r])))
        else:
            delta = beta * ((pi[c] - rho[c]) - (pi[r] - rho[r]))
            value = -(1 - smoothing) * math.log(1 / (1 + math.exp(-delta))) - smoothing * math.log(
                1 / (1 + math.exp(delta)))
            rewards.append((beta * (pi[c] - rho[c]), beta * (pi[r] - rho[r])))
        want.append(value)
    assert float(out["loss"].detach()) == pytest.approx(sum(want) / 2, rel=1e-5)
    assert float(out["rewards/chosen"]) == pytest.approx(sum(r[0] for r in rewards) / 2, rel=1e-5, abs=1e-6)
    assert float(out["rewards/rejected"]) == pytest.approx(sum(r[1] for r in rewards) / 2, rel=1e-5, abs=1e-6)
    assert float(out["rewards/margins"]) == pytest.approx(sum(a - b for a, b in rewards) / 2, rel=1e-5, abs=1e-6)
    assert float(out["rewards/accuracies"]) == sum(a > b for a, b in rewards) / 2
    shown = [p / k for p, k in zip(pi, n)] if loss == "simpo" else pi
    assert float(out["logps/chosen"]) == pytest.approx((shown[0] + shown[1]) / 2, rel=1e-5)
    out["loss"].backward()
    assert policy.table.grad is not None and reference.table.grad is None  # the reference stays frozen
    sums = task.validation_step(policy, batch)
    metrics = task.compute_metrics(sums)
    assert metrics["loss"] == pytest.approx(sum(want) / 2, rel=1e-5) and sums["pairs"] == 2


@pytest.mark.parametrize("kwargs,fragment", [
    ({"loss": "kto"}, "task.loss='kto': choose one of sigmoid, ipo, simpo"),
    ({"beta": 0.0}, "task.beta=0.0: must be above 0"),
    ({"beta": -1.0}, "task.beta=-1.0: must be above 0"),
    ({"label_smoothing": 0.5}, "task.label_smoothing=0.5: must be at least 0 and below 0.5"),
    ({"loss": "ipo", "label_smoothing": 0.1}, "IPO's squared loss has no smoothed form"),
    ({"loss": "simpo", "reference": "somewhere"}, "SimPO uses no reference model"),
])
def test_bad_settings_are_refused_naming_the_key(kwargs, fragment):
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        Preference(**kwargs)


def _write(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


GOOD = {"prompt": "Q: 2+2? A:", "chosen": " 4", "rejected": " 5"}


@pytest.mark.parametrize("bad,fragment", [
    ({"prompt": "Q", "chosen": "a"}, "has no 'rejected'"),
    ({"prompt": "Q", "chosen": "", "rejected": "b"}, "has an empty 'chosen'"),
    ({"prompt": "Q", "chosen": "a", "rejected": [{"role": "assistant", "content": "b"}]}, "not of one kind"),
    ({"chosen": "a", "rejected": "b"}, "has no 'prompt' (text responses need one"),
    ({"prompt": "", "chosen": "a", "rejected": "b"}, "has an empty 'prompt'"),
    ({"prompt": "  ", "chosen": "a", "rejected": "b"}, "'prompt' is not text"),
])
def test_a_file_that_is_not_all_pairs_is_refused_naming_the_file_and_line(tmp_path, bad, fragment):
    files = _write(tmp_path / "pairs.jsonl", [GOOD, GOOD, bad, GOOD])
    data = PreferenceFiles(files=files, block_size=64, cache_dir=str(tmp_path / "cache"))
    problems = data.problems()
    assert len(problems) == 1 and problems[0].startswith(f"data.files: {files}, line 3: the pair "), problems
    assert fragment in problems[0], problems


@pytest.mark.parametrize("data,bad", [
    ("preference_files", {"prompt": "Q", "rejected": "b"}),
    ("chat_files", {"note": "no conversation"}),
])
def test_a_bad_row_past_the_rows_checked_before_launch_is_named_by_its_line(tmp_path, data, bad):
    """Rows past those checked before launch are read when the data is prepared: a bad one at line
    30,000 still stops the run with exit 2 naming file and line (not a byte offset)."""
    from tests.helpers.in_process import run_command

    good = GOOD if data == "preference_files" else {"prompt": "Q: 2+2? A:", "response": " 4"}
    rows = [good] * 40_000
    rows[29_999] = bad
    files = _write(tmp_path / "rows.jsonl", rows)
    task = ["task=preference"] if data == "preference_files" else []
    result = run_command(["train", *task, f"data={data}", f"data.files={files}", f"data.cache_dir={tmp_path / 'cache'}",
                          "trainer.max_steps=1", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"(the first: {files}, line 30000)" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("family", ["gpt2", "llama2", "llama3", "qwen2.5"])
def test_both_text_responses_end_with_the_eos_once(tmp_path, family):
    """trl ends each text response with the eos (not the chosen alone, never twice): on tokenizers
    of families that have one, the chosen and the rejected both end with it, one already ending
    with the eos text gets no second."""
    from framework.data.tokenizer import loaded_tokenizer
    from tests.helpers.families import make_family

    directory = make_family(family, tmp_path / family)
    tokenizer = loaded_tokenizer(str(directory))
    eos, eos_text = tokenizer.eos_id, tokenizer.special.texts["eos"]
    rows = [GOOD, {"prompt": "Q: 1+1? A:", "chosen": " 2" + eos_text, "rejected": " 3"}]
    data = PreferenceFiles(files=_write(tmp_path / "pairs.jsonl", rows), block_size=64, tokenizer=str(directory),
                           cache_dir=str(tmp_path / "cache"))
    for row in rows:
        _, chosen, rejected = data.encoder().tokenise(row)
        assert chosen[-1] == eos and rejected[-1] == eos, (family, row)
        assert chosen.count(eos) == rejected.count(eos) == 1, (family, row)


def test_pairs_read_as_trl_reads_them(tmp_path):
    """Text pairs get the end-of-text token (where the tokenizer has one: bytes has none, the
    prompt + response split is where their ids part); messages with an implicit prompt split at
    their shared first turns; a prompt that fills the block is refused, or dropped when asked."""
    conversation = [{"role": "user", "content": "Hi?"}]
    rows = [GOOD, {"chosen": conversation + [{"role": "assistant", "content": "Hello."}],
                   "rejected": conversation + [{"role": "assistant", "content": "Go away."}]}]
    files = _write(tmp_path / "pairs.jsonl", rows)
    data = PreferenceFiles(files=files, block_size=64, chat_template="chatml", cache_dir=str(tmp_path / "cache"))
    encoder = data.encoder()
    prompt, chosen, rejected = encoder.tokenise(rows[0])
    assert bytes(prompt).decode() == "Q: 2+2? A:" and bytes(chosen).decode() == " 4" and bytes(rejected) == b" 5"
    prompt, chosen, rejected = encoder.tokenise(rows[1])
    assert bytes(prompt).decode() == "<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n"
    assert bytes(chosen).decode() == "Hello.<|im_end|>\n" and bytes(rejected).decode() == "Go away.<|im_end|>\n"
    long = {"prompt": "x" * 80, "chosen": "a", "rejected": "b"}
    files = _write(tmp_path / "long.jsonl", [GOOD, long])
    refused = PreferenceFiles(files=files, block_size=64, cache_dir=str(tmp_path / "cache")).problems()
    assert "no response token is left within the block" in refused[0] and "data.drop_unscorable=true" in refused[0]
    kept = PreferenceFiles(files=files, block_size=64, drop_unscorable=True, cache_dir=str(tmp_path / "cache"),
                           val_percent=1, batch_size=1)
    assert kept.problems() == [] and kept.encoder().tokenise(long) is None


def test_a_reference_that_cannot_be_is_refused_before_launch(tmp_path):
    """In this process, through the command's own entry (tests/helpers/in_process.py)."""
    from tests.helpers.in_process import run_command

    def run_train(args, cwd):
        return run_command(["train", *args], cwd)

    args = ["task=preference", "data=preference_files", "trainer.max_steps=1", "model.n_layer=1", "model.n_embd=16",
            "model.n_head=2", "model.block_size=256", f"data.cache_dir={tmp_path / 'cache'}"]
    missing = run_train([*args, f"task.reference={tmp_path / 'nowhere'}"], tmp_path)
    assert missing.returncode == 2 and f"task.reference={tmp_path / 'nowhere'}: no such directory" in missing.stderr
    transformers = pytest.importorskip("transformers")
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=300, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2)).save_pretrained(tmp_path / "hub")
    wrong = run_train([*args, f"task.reference={tmp_path / 'hub'}"], tmp_path)
    assert wrong.returncode == 2 and "its model scores 300 token ids, the trained model 256" in wrong.stderr
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{}")
    broken = run_train([*args, f"task.reference={tmp_path / 'broken'}"], tmp_path)
    assert broken.returncode == 2 and "Should have a `model_type` key in its config.json" in broken.stderr
    unknown = run_train([*args, "task.loss=dpo"], tmp_path)
    assert unknown.returncode == 2 and "task.loss='dpo': must be one of 'sigmoid', 'ipo', 'simpo'" in unknown.stderr
    kept = run_train([*args, "adapter=lora", "adapter.modules_to_save=[head]"], tmp_path)
    assert kept.returncode == 2 and "those modules train whole and do not go back" in kept.stderr


# ---- whole runs ------------------------------------------------------------------------------------------
STEPS, PAIRS, BLOCK, LR = 5, 4, 256, 1e-3
RUN = ["task=preference", "data=preference_files", "data.shuffle=false", f"data.block_size={BLOCK}",
       f"optimizer.lr={LR}", "optimizer.betas=[0.9,0.999]", "optimizer.weight_decay=0", "scheduler=constant",
       "trainer.clip_grad_norm=1.0", f"trainer.max_steps={STEPS}", "trainer.log_every=1", f"trainer.val_every={STEPS}",
       "trainer.val_batches=1", "trainer.progress_bar=false", "trainer.plot=false", "trainer.val_at_start=false",
       "seed=0"]
TRL_KEYS = ("loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies")


def _trl_run(base, root, lora: bool) -> list[dict]:
    """trl 1.16's DPOTrainer on the same pairs' token ids (its tokenisation bypassed: our store's ids),
    in order, float32 (its bf16 default off), the same optimizer, clipping and constant LR."""
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    import transformers
    from tokenizers import Tokenizer, models

    data = PreferenceFiles(files=example_data("stdlib_preferences.jsonl"), chat_template="chatml", block_size=BLOCK)
    data.prepare_data()
    train = data.train_dataset()
    rows = [{k: v.tolist() for k, v in train[i].items()} for i in range(PAIRS * STEPS)]
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({f"<{i}>": i for i in range(256)}, unk_token="<0>")),
        pad_token="<0>", eos_token="<1>")
    policy = transformers.AutoModelForCausalLM.from_pretrained(base)
    reference = transformers.AutoModelForCausalLM.from_pretrained(base)
    if lora:  # the adapters as adapter=lora makes them (seeded by the run's seed and each layer's name)
        from framework.adapter.lora import LoRA

        torch.manual_seed(0)
        policy = LoRA().apply(policy)
    config = trl.DPOConfig(output_dir=str(root), use_cpu=True, report_to=[], per_device_train_batch_size=PAIRS,
                           max_steps=STEPS, logging_steps=1, learning_rate=LR, lr_scheduler_type="constant",
                           warmup_steps=0, max_grad_norm=1.0, beta=0.1, loss_type=["sigmoid"], max_length=BLOCK,
                           save_strategy="no", train_sampling_strategy="sequential", bf16=False,
                           gradient_checkpointing=False, optim="adamw_torch", weight_decay=0.0, seed=0)
    prepare = trl.DPOTrainer._prepare_dataset
    trl.DPOTrainer._prepare_dataset = lambda self, dataset, *args, **kwargs: dataset
    try:
        trainer = trl.DPOTrainer(model=policy, ref_model=reference, args=config, processing_class=tokenizer,
                                 train_dataset=datasets.Dataset.from_list(rows))
    finally:
        trl.DPOTrainer._prepare_dataset = prepare
    first = trainer.data_collator(rows[:PAIRS])
    mine = data.collate()([train[i] for i in range(PAIRS)])
    assert torch.equal(first["input_ids"], mine["input_ids"])  # the same batch, token for token
    ours_ref = sequence_logps(reference, mine)[0]
    theirs_ref = torch.cat(trainer.compute_ref_log_probs(reference, first))
    torch.testing.assert_close(ours_ref, theirs_ref, rtol=1e-5, atol=0)  # per sequence, the reference's
    trainer.train()
    return [h for h in trainer.state.log_history if "loss" in h]


@pytest.fixture(scope="module")
def trl_runs(tiny_llama, tmp_path_factory):
    return {lora: _trl_run(tiny_llama, tmp_path_factory.mktemp("trl"), lora) for lora in (False, True)}


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["one_process", "fsdp_2_processes", "lora"])
def test_dpo_gives_trls_losses_rewards_and_log_probabilities(tiny_llama, trl_runs, tmp_path, layout):
    pytest.importorskip("trl")
    extra = {"one_process": [f"data.batch_size={PAIRS}"],
             "fsdp_2_processes": ["strategy=fsdp", "devices=2", f"data.batch_size={PAIRS // 2}"],
             "lora": [f"data.batch_size={PAIRS}", "adapter=lora"]}[layout]
    run = tmp_path / layout
    run_inprocess(["model=hf_causal_lm", "model.config=null", f"model.pretrained={tiny_llama}", *RUN, *extra], run)
    theirs = trl_runs[layout == "lora"]
    assert len(theirs) == STEPS
    for key in TRL_KEYS:  # within 1e-5 step by step (float32 throughout)
        torch.testing.assert_close(torch.tensor(metric_values(run, f"train/{key}")),
                                   torch.tensor([float(h[key]) for h in theirs], dtype=torch.float32),
                                   rtol=0, atol=1e-5, msg=key)
    for key in ("logps/chosen", "logps/rejected"):  # sums of ~250 tokens' log-probabilities: ~700 in size
        torch.testing.assert_close(torch.tensor(metric_values(run, f"train/{key}")),
                                   torch.tensor([float(h[key]) for h in theirs], dtype=torch.float32),
                                   rtol=1e-5, atol=0, msg=key)
    assert metric_values(run, "train/loss")[0] == pytest.approx(math.log(2), abs=1e-6)
    assert abs(metric_values(run, "train/rewards/chosen")[-1]) >= 1e-3  # the reference and the policy apart


# ---- every strategy that places the reference, as one process -----------------------------------------
GPT = ["task=preference", "data=preference_files", *TWO_LAYER_GPT, "model.block_size=256", "data.shuffle=false",
       "trainer.val_batches=null", *FOUR_LOGGED_STEPS, "data.test_percent=5"]
LAYOUTS = TWO_PROCESS_LAYOUTS
PREFERENCE_KEYS = ("train/loss", "train/rewards/chosen", "train/rewards/margins", "train/logps/chosen", "val/loss",
                   "val/rewards/accuracies")


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_strategy_places_the_reference_and_trains_one_processs_numbers(layout):
    one, run = trained_run([*GPT, *ONE_PROCESS]), trained_run([*GPT, *LAYOUTS[layout]])
    for key in PREFERENCE_KEYS:
        got, want = metric_values(run, key), metric_values(one, key)
        assert len(got) == len(want) > 0, key
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-5, msg=key)
    assert metric_values(one, "train/rewards/chosen")[-1] != 0  # the reference did not follow the policy
    final, straight = load_model_state(checkpoint_at(run, 4)), load_model_state(checkpoint_at(one, 4))
    assert set(final) == set(straight)  # the policy alone: no reference in the checkpoint
    for key, value in straight.items():
        torch.testing.assert_close(final[key], value, rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.slow
def test_a_resumed_run_rebuilds_its_reference_and_continues_sample_exact(tmp_path):
    straight = trained_run([*GPT, *ONE_PROCESS])
    resumed = tmp_path / "resumed"
    run_inprocess([*GPT, *ONE_PROCESS, f"ckpt_path={checkpoint_at(straight, 2)}"], resumed)
    for key in ("train/loss", "train/rewards/chosen", "train/rewards/margins"):
        assert metric_values(resumed, key) == metric_values(straight, key)[2:], key
    final, want = load_model_state(checkpoint_at(resumed, 4)), load_model_state(checkpoint_at(straight, 4))
    assert all(torch.equal(final[k], want[k]) for k in want)


@pytest.mark.slow
def test_framework_test_reports_the_preference_metrics_on_held_out_pairs(tmp_path):
    from tests.helpers.in_process import run_command

    run = trained_run([*GPT, *ONE_PROCESS])
    result = run_command(["test", str(run)], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    shown = " ".join(result.stdout.split())
    for key in ("test/loss", "test/rewards/chosen", "test/rewards/accuracies", "test/rewards/margins",
                "test/logps/chosen", "test/logps/rejected"):
        assert key in shown, (key, shown[-1500:])


def test_plan_counts_the_references_weights_sharded_as_the_policys(tmp_path):
    from tests.helpers.in_process import run_command

    args = ["plan", "task=preference", "data=preference_files", "model.block_size=256", "strategy=fsdp", "devices=2"]
    shown = run_command(args, tmp_path)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    params = int(next(line for line in lines if "trainable parameters" in line).split(": ")[1].split()[0].replace(",", ""))
    assert f"task.reference: a frozen second model of {params:,} parameters" in shown.stdout
    assert "frozen/N" in next(line for line in lines if line.strip().startswith("fsdp:"))
    lora = run_command([*args, "adapter=lora"], tmp_path)  # the policy with its adapters off: nothing more
    assert lora.returncode == 0 and "task.reference" not in lora.stdout


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["single_device", "fsdp", "deepspeed_stage_3"])
def test_the_reference_computes_in_the_policys_precision(layout):
    """Under bf16 the first step's policy and reference are the same weights computed the same way:
    a loss of ln 2 and zero rewards exactly (a reference left in float32 beside a bf16 policy would
    show rewards of bf16's rounding)."""
    extra = ["devices=1", "data.batch_size=4"] if layout == "single_device" else [f"strategy={layout}", "devices=2",
                                                                                  "data.batch_size=2"]
    run = trained_run([*GPT[:GPT.index("callbacks=[checkpoint]")], "precision=bf16", "trainer.max_steps=2", *extra])
    assert metric_values(run, "train/loss")[0] == pytest.approx(math.log(2), abs=1e-6)
    assert metric_values(run, "train/rewards/chosen")[0] == 0 and metric_values(run, "train/rewards/margins")[0] == 0
    assert metric_values(run, "train/rewards/chosen")[1] != 0


@pytest.mark.slow
def test_dropout_is_off_by_default_so_the_first_step_is_ln_2(tmp_path):
    """The built-in GPT with dropout 0.1, as trl's DPOTrainer runs a model with dropout: off in the
    policy by default (task.disable_dropout), so the first step's loss is ln 2 with zero rewards;
    kept on, the policy's log-probabilities carry a dropout mask and the first step is not ln 2."""
    args = [*[a for a in GPT if not a.startswith("callbacks")], "model.dropout=0.1", "data.batch_size=4",
            "trainer.max_steps=1", "trainer.val_every=1", "data.test_percent=0"]
    off, on = tmp_path / "off", tmp_path / "on"
    run_inprocess(args, off)
    run_inprocess([*args, "task.disable_dropout=false"], on)
    assert metric_values(off, "train/loss")[0] == pytest.approx(math.log(2), abs=1e-6)
    assert metric_values(off, "train/rewards/chosen")[0] == 0 == metric_values(off, "train/rewards/margins")[0]
    assert abs(metric_values(on, "train/loss")[0] - math.log(2)) > 1e-3


def test_the_reference_with_the_adapters_off_computes_in_eval_mode():
    """With LoRA the reference is the policy with its adapters off: its log-probabilities come without
    dropout even while the policy trains with it (task.disable_dropout=false), and the policy's mode
    is its own again after."""
    from framework.adapter.lora import LoRA
    from framework.models.gpt import GPT as BuiltinGPT

    torch.manual_seed(0)
    model = LoRA(target_modules=["qkv"]).apply(BuiltinGPT(vocab_size=VOCAB, block_size=16, n_layer=1, n_head=2,
                                                           n_embd=16, dropout=0.5))
    task = Preference(disable_dropout=False)
    task.use_frozen(Frozen("task.reference"))  # the trained model with its adapters off
    batch = {"input_ids": torch.randint(0, VOCAB, (2, 8)), "labels": torch.randint(0, VOCAB, (2, 8))}
    model.train()
    first, second = task.reference_logps(model, batch), task.reference_logps(model, batch)
    assert torch.equal(first, second) and model.training
