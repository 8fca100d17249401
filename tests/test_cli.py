import subprocess
import sys

import pytest
import torch

from tests.conftest import TINY_GPT


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "framework", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def test_version():
    result = run_cli("version")
    assert result.returncode == 0 and f"torch {torch.__version__}" in result.stdout


def test_help_lists_commands():
    result = run_cli()
    assert result.returncode == 0 and "train" in result.stdout and "version" in result.stdout


@pytest.mark.slow
def test_train_subcommand_is_train_py(tmp_path):
    result = run_cli("train", "name=cli", "trainer.max_steps=2", *TINY_GPT, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "outputs" / "cli" / "summary.json").is_file()
    bad = run_cli("train", "strategy=nope", cwd=tmp_path)
    assert bad.returncode == 2 and "strategy=nope: no such option" in bad.stderr
