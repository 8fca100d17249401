"""docs/walkthrough.md run as written: each ```bash block of the page, in order, in one empty
directory, with bash (`framework` and `python` the installed ones); each ```text block after it
lists lines its output must contain (the figures the page shows), each matched where it occurs.
Offline: nothing is fetched (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE, as on a machine without the
network)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

PAGE = ROOT / "docs" / "walkthrough.md"

pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("lm_eval")


def blocks(text: str) -> list[tuple[str, str, int]]:
    """(language, body, line of the opening fence) of each fenced block."""
    return [(m.group(1), m.group(2), text[:m.start()].count("\n") + 1)
            for m in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.S | re.M)]


def test_the_walkthrough_is_linked_from_the_readme_and_the_site():
    assert "docs/walkthrough.md" in (ROOT / "README.md").read_text()
    assert "walkthrough.md" in (ROOT / "mkdocs.yml").read_text()


@pytest.mark.slow
def test_the_walkthrough_runs_as_written(tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    output, ran = "", 0
    for language, body, line in blocks(PAGE.read_text()):
        if language == "bash":
            result = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", body], cwd=tmp_path, env=env,
                                    capture_output=True, text=True, timeout=600)
            output = result.stdout + result.stderr
            assert result.returncode == 0, f"docs/walkthrough.md:{line}: the block fails:\n{output[-4000:]}"
            ran += 1
        elif language == "text":
            for shown in filter(None, (s.strip() for s in body.splitlines())):
                assert shown in output, f"docs/walkthrough.md:{line}: {shown!r} is not in the output:\n{output[-4000:]}"
    assert ran == 7
    assert (tmp_path / "outputs/dpo/eval_metrics.json").is_file() and (tmp_path / "sft_model/config.json").is_file()
