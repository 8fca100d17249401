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


def test_a_single_run_is_composed_once_and_its_checks_still_refuse(tmp_path, monkeypatch, capsys):
    """The guard checks the config Hydra composes for the run instead of composing it first: one
    composition per run (start-up), the same refusals, nothing left behind."""
    import atexit
    import gc

    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    from framework import entry_guard
    from framework.cli import main

    calls = []
    original = ConfigLoaderImpl.load_configuration

    def counted(self, *args, **kwargs):
        calls.append(kwargs.get("overrides"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration", counted)
    monkeypatch.chdir(tmp_path)
    registered = []
    monkeypatch.setattr(atexit, "register", lambda fn, *a, **k: registered.append(fn) or fn)
    monkeypatch.setattr(entry_guard, "_shutdown_registered", False)
    argv = sys.argv[:]
    try:
        assert main(["train", "name=once", "trainer.max_steps=1", *TINY_GPT]) == 0
        assert len(calls) == 1
        assert registered.count(gc.freeze) == 1  # when the process ends: a shorter shutdown
        calls.clear()
        with pytest.raises(SystemExit) as refused:
            main(["train", "name=refused", "+hydra.callbacks.x._target_=os.system"])
        assert refused.value.code == 2 and not (tmp_path / "outputs" / "refused").exists()
        assert "hydra.callbacks.x._target_=os.system is not in the trusted targets" in capsys.readouterr().err
    finally:
        sys.argv[:] = argv
