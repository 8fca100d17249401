"""docs/your-model.md as a reader follows it: every file it shows is written into an empty folder,
every command it shows runs there, in order (a few steps each), and its line counts are true."""
from __future__ import annotations

import csv
import json
import re
import shlex
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.helpers.in_process import run_command

DOC = ROOT / "docs" / "your-model.md"
SHORT = ["trainer.max_steps=2", "trainer.val_every=2", "trainer.val_batches=1", "trainer.log_every=1",
         "trainer.progress_bar=false", "trainer.plot=false"]

pytest.importorskip("transformers")


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.S)


def shown_files() -> dict[str, str]:
    files = {}
    for language in ("python", "yaml"):
        for block in blocks(language):
            first, _, body = block.partition("\n")
            if first.startswith("# file: "):
                files[first.removeprefix("# file: ").strip()] = body
    return files


def shown_commands() -> list[list[str]]:
    lines = [line.split(" #")[0].strip() for block in blocks("bash") for line in block.splitlines()]
    return [shlex.split(line) for line in lines if line.startswith(("framework ", "python make_sample_data.py"))]


def code_lines(text: str) -> int:
    return len([line for line in text.splitlines() if line.strip() and not line.strip().startswith("#")])


def test_the_line_counts_in_the_table_are_those_of_the_listings():
    files = shown_files()
    lightning, accelerate = blocks("text")
    table = DOC.read_text()
    assert f"| {code_lines(lightning)} Python |" in table and f"| {code_lines(accelerate)} Python," in table
    assert f"0 Python, {code_lines(files['gpt2_on_my_text.yaml'])} YAML" in table
    assert f"the module + {code_lines(files['my_project/tiny_lm.yaml'])} YAML" in table
    assert f"{code_lines(files['my_project/small_cnn.py'])} lines of Python (the module) and " \
           f"{code_lines(files['my_project/digits_cnn.yaml'])} of YAML" in table


@pytest.mark.slow
def test_every_file_and_command_of_the_guide_works_as_shown(tmp_path):
    for name, text in shown_files().items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    commands = shown_commands()
    assert len(commands) >= 6
    for argv in commands:
        if argv[0] == "python":
            argv = [sys.executable, *argv[1:]]
        elif argv[1] in ("run", "train"):
            argv = [sys.executable, "-m", "framework", *argv[1:], *SHORT, "data.cache_dir=cache"]
            if any(name in " ".join(argv) for name in ("squares", "tiny_lm", "digits_cnn")):
                argv.remove("data.cache_dir=cache")  # their data has no cache
        elif argv[1] in ("test", "plot", "generate") or "chat_lora" in argv[2]:  # a run directory, as shown
            argv = [sys.executable, "-m", "framework", *argv[1:]]
        else:  # framework convert: the checkpoint a full-length run would have made is the last one here
            run_dir = tmp_path / argv[2].split("/checkpoints/")[0]
            argv = [sys.executable, "-m", "framework", argv[1],
                    str(sorted((run_dir / "checkpoints").glob("step_*"))[-1]), *argv[3:]]
        if argv[1:3] == ["-m", "framework"]:  # as typed, through the command's own entry, in this process
            result = run_command(argv[3:], tmp_path)
        else:
            result = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"{shlex.join(argv)}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    for name in ("gpt2_fsdp", "gpt2_cli", "llama", "llama_whole", "hf_recipe", "tiny_lm", "chat_lora"):
        with open(tmp_path / "outputs" / name / "metrics.csv") as f:
            assert [r["step"] for r in csv.DictReader(f) if r.get("train/loss")] == ["1", "2"], name
    with open(tmp_path / "outputs" / "squares" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert any(r.get("train/mae") for r in rows) and any(r.get("val/mse") for r in rows)
    tested = json.loads((tmp_path / "outputs" / "digits_cnn" / "test_metrics.json").read_text())
    assert tested["world_size"] == 2 and {"test/f1_score", "test/recall/9", "test/accuracy"} <= set(tested["metrics"])
    assert (tmp_path / "outputs" / "digits_cnn" / "metrics.png").is_file()
    assert (tmp_path / "exported" / "model.safetensors").is_file() and (tmp_path / "exported" / "tokenizer.json").is_file()
    assert json.loads((tmp_path / "chat_adapters" / "adapter_config.json").read_text())["r"] == 8
    chat_rows = (tmp_path / "chat.jsonl").read_text().splitlines()
    assert len(chat_rows) > 20 and set(json.loads(chat_rows[0])) == {"prompt", "response"}
