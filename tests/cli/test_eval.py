"""`framework eval` through EleutherAI's lm-evaluation-harness: local task files only (nothing is
downloaded); a built-in GPT run scored by the framework's own harness model (a multiple-choice task,
and a rolling log-likelihood equal to `framework test`'s loss on the same text and windows); a tiny
Hugging Face model trained here scored through the harness's own `hf` class with the same acc as
lm-eval's own command line on the export; every bad input refused naming the argument."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import metric_values
from tests.helpers.in_process import run_command
from tests.helpers.run_cache import trained_run
from tests.helpers.text_data import stdlib_documents, write_jsonl

pytest.importorskip("lm_eval")
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
BLOCK = 64


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)


def _tasks(root):
    """A multiple-choice task (the likelier Python continuation) and a rolling log-likelihood task,
    as the harness's YAML task files over local JSON lines."""
    root.mkdir(parents=True, exist_ok=True)
    pairs = [("for i in ", ["range(10):", "banana(10):", "zebra(10):"]), ("import ", ["os", "xyzzy", "qqq"]),
             ("def __init__(", ["self", "cake", "moon"]), ("return ", ["None", "Nonf", "Xone"]),
             ("if __name__ == ", ["'__main__':", "'__moon__':", "'__tree__':"])]
    rows = [{"question": q, "choices": c, "label": 0} for q, c in pairs * 4]
    (root / "mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "pymc.yaml").write_text(
        f"task: pymc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {root / 'mc.jsonl'}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{question}}'\ndoc_to_target: '{{label}}'\n"
        "doc_to_choice: '{{choices}}'\ntarget_delimiter: ''\nmetric_list:\n  - metric: acc\n")
    (root / "pygen.yaml").write_text(
        f"task: pygen\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {root / 'mc.jsonl'}\n"
        "test_split: test\noutput_type: generate_until\ndoc_to_text: '{{question}}'\n"
        "doc_to_target: '{{choices[0]}}'\ngeneration_kwargs:\n  until: ['\\n']\n  max_gen_toks: 12\n"
        "metric_list:\n  - metric: exact_match\n")
    (root / "pyppl.yaml").write_text(
        f"task: pyppl\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {root / 'texts.jsonl'}\n"
        "test_split: test\noutput_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
        "metric_list:\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n")
    return root


def _texts(root) -> list[str]:
    """Texts of BLOCK - 1 ASCII characters (one token each on bytes): a text is one window of the
    harness's rolling log-likelihood (its first token predicted from the newline the framework's
    harness model puts before a text), and one block of `framework test` when stored with that
    newline in front."""
    source = "".join(stdlib_documents(40, max_chars=3000)[20:]).encode("ascii", "ignore").decode()
    texts = [source[i:i + BLOCK - 1] for i in range(0, 40 * (BLOCK - 1), BLOCK - 1)]
    (root / "texts.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    write_jsonl(root / "framework_test.jsonl", ["\n" + t for t in texts])
    return texts


def test_bad_input_is_refused_naming_the_argument(tmp_path):
    tasks = _tasks(tmp_path / "tasks")
    (tmp_path / "empty").mkdir()
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("seed: 0\n")
    cases = [
        (["eval", str(run), "--tasks", "pymc", "--include-path", str(tmp_path / "empty")], "holds no YAML task file"),
        (["eval", str(run), "--tasks", "pymc", "--include-path", str(tmp_path / "nowhere")], "no such directory"),
        (["eval", str(run), "--tasks", "pymcc", "--include-path", str(tasks)],
         "--tasks pymcc: pymcc is no task of the harness nor of --include-path"),
        (["eval", str(run), "--tasks", "pymc", "--include-path", str(tasks)], "the run saved none"),
        (["eval", str(run), "--tasks", "pymc", "--limit", "-1"], "argument --limit: '-1' is neither a number"),
        (["eval", str(run), "--tasks", "pymc", "--limit", "0"], "argument --limit: '0' is neither a number"),
        (["eval", str(run), "--tasks", "pymc", "--limit", "2.5"], "argument --limit: '2.5' is neither a number"),
        (["eval", str(run), "--tasks", "pymc", "--num-fewshot", "-1"],
         "argument --num-fewshot: '-1' is not a whole number of 0 or more (examples in each prompt)"),
        (["eval", str(run), "--tasks", "pymc", "--batch-size", "0"],
         "argument --batch-size: '0' is not a whole number of 1 or more (requests a forward scores)"),
        (["eval", str(run), "--tasks", "pymc", "--seed", "1,2"], "give one integer for every seed, or four"),
        (["eval", str(run), "--tasks", "pymc", "--dtype", "int8"], "argument --dtype: invalid choice: 'int8'"),
    ]
    gone = tmp_path / "gone"
    gone.mkdir()
    (gone / "pymc.yaml").write_text((tasks / "pymc.yaml").read_text().replace(str(tasks / "mc.jsonl"),
                                                                               str(gone / "missing.jsonl")))
    cases.append((["eval", str(run), "--tasks", "pymc", "--include-path", str(gone)],
                  f"a task's data file does not exist (pymc ({gone / 'pymc.yaml'}): {gone / 'missing.jsonl'})"))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "pymc.yaml").write_text((tasks / "pymc.yaml").read_text())
    (broken / "other.yaml").write_text("task: other\n dataset_path: [json\n")
    cases.append((["eval", str(run), "--tasks", "pymc", "--include-path", str(broken)],
                  f"a task file is not valid YAML ({broken / 'other.yaml'} line 2:"))
    for argv, fragment in cases:
        result = run_command(argv, tmp_path)
        assert result.returncode == 2 and fragment in " ".join(result.stderr.split()), (argv, result.stderr)
        assert "Traceback" not in result.stderr
    assert not (run / "eval_metrics.json").exists()


def test_eval_runs_where_the_run_trained_and_in_the_dtype_it_kept_its_weights():
    import yaml

    from framework.cli.eval import run_device, run_dtype
    from tests.conftest import ROOT

    def precision(name):
        return {"precision": yaml.safe_load((ROOT / "conf/precision" / f"{name}.yaml").read_text())}

    assert {name: run_dtype(precision(name)) for name in ("32", "bf16", "bf16_true", "16", "16_true", "64")} == {
        "32": "float32", "bf16": "float32", "bf16_true": "bfloat16", "16": "float32", "16_true": "float16",
        "64": "float64"}  # the mixed ones keep float32 weights
    assert run_dtype(None) == "float32"
    cuda = {"accelerator": {"_target_": "framework.accelerator.cuda.CUDAAccelerator"}}
    assert run_device(cuda) == ("cuda" if torch.cuda.is_available() else "cpu")
    assert run_device({"accelerator": {"_target_": "framework.accelerator.cpu.CPUAccelerator"}}) == "cpu"


def test_without_the_harness_the_extra_to_install_is_named(tmp_path, monkeypatch):
    import builtins

    real = builtins.__import__

    def missing(name, *args, **kwargs):
        if name.startswith("lm_eval"):
            raise ImportError("No module named 'lm_eval'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", missing)
    result = run_command(["eval", str(tmp_path), "--tasks", "x"], tmp_path)
    assert result.returncode == 2 and "pip install 'framework[eval]'" in result.stderr


@pytest.mark.slow
def test_a_gpt_run_is_scored_and_its_rolling_likelihood_is_framework_tests_loss(tmp_path):
    tasks = _tasks(tmp_path / "tasks")
    _texts(tasks)
    train = write_jsonl(tmp_path / "train.jsonl", stdlib_documents(20, max_chars=6000))
    run = trained_run(["model.n_layer=2", "model.n_embd=64", "model.n_head=2", f"model.block_size={BLOCK}",
                       "model.dropout=0.0", "data=text_files", f"data.files={train}",
                       f"data.test_files={tasks / 'framework_test.jsonl'}", f"data.block_size={BLOCK}",
                       "trainer.max_steps=60", "trainer.val_every=60", "trainer.progress_bar=false", "trainer.plot=false",
                       "callbacks=[checkpoint]"])
    result = run_command(["eval", str(run), "--tasks", "pymc,pyppl,pygen", "--include-path", str(tasks)], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((run / "eval_metrics.json").read_text())
    assert record["step"] == 60 and record["lm_eval"] and record["tasks"]["pymc"]["n-shot"] == 0
    acc = record["tasks"]["pymc"]["metrics"]["acc"]
    assert 0 <= acc <= 1 and metric_values(run, "eval/pymc/acc") == [acc]  # the run's logger has it too
    assert 0 <= record["tasks"]["pygen"]["metrics"]["exact_match"] <= 1  # greedy generation, cut at the newline
    assert "on cpu in float32" in result.stdout  # the run's accelerator and precision
    again = run_command(["eval", str(run), "--tasks", "pymc", "--include-path", str(tasks), "--num-fewshot", "1",
                         "--limit", "10"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert metric_values(run, "eval/pymc/acc") == [acc]  # the first evaluation's cell kept
    assert len(metric_values(run, "eval/pymc/1-shot/limit-10/acc")) == 1
    history = [json.loads(line) for line in (run / "eval_history.jsonl").read_text().splitlines()]
    assert [(h["num_fewshot"], h["limit"], h["step"]) for h in history] == [(None, None, 60), (1, 10.0, 60)]
    assert history[0]["seed"] == [0, 1234, 1234, 1234]  # lm-eval's own defaults
    tested = run_command(["test", str(run)], tmp_path)
    assert tested.returncode == 0, tested.stderr[-3000:]
    metrics = json.loads((run / "test_metrics.json").read_text())["metrics"]
    loss = metrics.get("test/loss", metrics.get("loss"))
    # the same windows: each text one block after its newline; bytes: a token is a byte
    rolled = math.log(record["tasks"]["pyppl"]["metrics"]["byte_perplexity"])
    assert rolled == pytest.approx(loss, abs=1e-4)


@pytest.mark.slow
def test_a_hugging_face_run_scores_as_lm_evals_own_command_line_on_its_export(tmp_path):
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tasks = _tasks(tmp_path / "tasks")
    base = tmp_path / "base"
    base.mkdir()
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(stdlib_documents(30, max_chars=3000), trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.save(str(base / "tokenizer.json"))
    transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=400, n_positions=128, n_embd=32, n_layer=1,
                                                         n_head=2, bos_token_id=0, eos_token_id=0)).save_pretrained(base)
    run = tmp_path / "outputs" / "hf"
    train = write_jsonl(tmp_path / "train.jsonl", stdlib_documents(20, max_chars=6000))
    trained = run_command(["train", "model=hf_causal_lm", "model.config=null", f"model.pretrained={base}",
                           "data=text_files", f"data.files={train}", "data.block_size=64", "trainer.max_steps=20", "trainer.val_every=20",
                           "trainer.progress_bar=false", "trainer.plot=false", "callbacks=[checkpoint]",
                           f"hydra.run.dir={run}"], tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    ours = run_command(["eval", str(run), "--tasks", "pymc", "--include-path", str(tasks), "--batch-size", "4",
                        "--num-fewshot", "2"], tmp_path)  # 2-shot: the few-shot examples drawn with lm-eval's seeds
    assert ours.returncode == 0, ours.stderr[-3000:]
    assert "exported" in ours.stdout
    exported = run_command(["convert", str(run), str(tmp_path / "export"), "--to", "hf"], tmp_path)
    assert exported.returncode == 0, exported.stderr
    theirs = subprocess.run([sys.executable, "-m", "lm_eval", "run", "--model", "hf", "--model_args",
                             f"pretrained={tmp_path / 'export'},dtype=float32", "--tasks", "pymc", "--include_path",
                             str(tasks), "--batch_size", "4", "--num_fewshot", "2", "--device", "cpu", "--output_path",
                             str(tmp_path / "lm_eval_out")], capture_output=True, text=True, timeout=600,
                            env={**os.environ, **OFFLINE}, cwd=tmp_path)
    assert theirs.returncode == 0, theirs.stderr[-3000:]
    written = next((tmp_path / "lm_eval_out").rglob("results_*.json"))
    their_acc = json.loads(written.read_text())["results"]["pymc"]["acc,none"]
    our_acc = json.loads((run / "eval_metrics.json").read_text())["tasks"]["pymc"]["metrics"]["acc"]
    assert our_acc == their_acc
    direct = run_command(["eval", str(tmp_path / "export"), "--tasks", "pymc", "--include-path", str(tasks),
                          "--batch-size", "4", "--num-fewshot", "2"], tmp_path)  # the Hugging Face directory itself
    assert direct.returncode == 0, direct.stderr[-3000:]
    assert json.loads((tmp_path / "export" / "eval_metrics.json").read_text())["tasks"]["pymc"]["metrics"]["acc"] \
        == their_acc
