"""The generated pages of the manual are current (`make reference` writes them from conf/, the code,
the tests and the GPU results), and the docs' prose names only keys, options and paths that exist
(docs/_hooks/claims.py, which `make docs` runs on every page)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from framework.reference import pages
from tests.conftest import ROOT
from tests.helpers.matrix import matrix_cells

DOC_PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _claims():
    spec = importlib.util.spec_from_file_location("claims", ROOT / "docs" / "_hooks" / "claims.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


claims = _claims()


def _stale(generated: dict) -> list[str]:
    return [path.relative_to(ROOT).as_posix() for path, text in generated.items()
            if not path.is_file() or path.read_text() != text]


def test_the_config_reference_and_the_known_keys_are_current():
    stale = _stale(pages.generated(matrix=False))
    assert not stale, f"stale: {stale}; run `make reference` and commit the pages"


def _whole_suite_collected(session) -> bool:
    options = session.config.option
    return not (options.markexpr or options.keyword or options.deselect) and \
        all(os.path.abspath(a) in (str(ROOT), str(ROOT / "tests")) for a in session.config.args)


@pytest.mark.slow
def test_the_support_matrix_is_current(request):
    """Its cells rerun the pre-launch checks (~200 compositions); its tests are this session's
    collection where it collected the whole suite, else a collection of their own."""
    session = request.session
    tested = ({tuple(k.split("|")): v for k, v in matrix_cells(session.items).items()}
              if _whole_suite_collected(session) else None)
    page = {pages.MATRIX_PAGE: pages.matrix_page(tested if tested is not None else pages.collected_matrix_tests())}
    assert not _stale(page), "stale: docs/reference/support-matrix.md; run `make reference` and commit it"


def test_make_reference_check_says_what_is_stale(tmp_path, monkeypatch, capsys):
    from framework.reference.__main__ import main

    monkeypatch.setattr(pages, "CONFIG_PAGE", tmp_path / "config.md")
    monkeypatch.setattr(pages, "KNOWN_KEYS", tmp_path / "known_keys.json")
    monkeypatch.setattr("framework.reference.__main__.generated", lambda: pages.generated(matrix=False))
    monkeypatch.setattr("framework.reference.__main__.ROOT", tmp_path)
    assert main(["--check"]) == 1 and "config.md" in capsys.readouterr().err
    assert not (tmp_path / "config.md").exists()  # --check writes nothing
    assert main([]) == 0 and (tmp_path / "config.md").read_text().startswith("# Config reference")
    assert main(["--check"]) == 0


def test_the_config_reference_gives_the_default_a_run_uses():
    text = pages.CONFIG_PAGE.read_text()
    assert "| `trainer.val_batches` | `10` |" in text and "| `trainer.clip_grad_norm` | `1.0` |" in text
    assert "| `strategy.reshard_after_forward` | `true` | `bool` |" in text  # the YAML's value, the signature's type
    # a key the YAML leaves out, at its signature's default
    assert "| `strategy.sync_module_states` |" not in text or "leaves at its default" in text
    for group in ("accelerator", "strategy", "precision", "checkpoint_io", "cluster", "fault_tolerance", "model",
                  "model/config", "data", "task", "optimizer", "scheduler", "logger", "callbacks", "adapter"):
        assert f"\n## {group}\n" in text, group


# ---- the prose ----------------------------------------------------------------------------------

def test_the_docs_name_only_keys_options_and_paths_that_exist():
    known = claims.load_known()
    problems = [p for doc in DOC_PAGES for p in claims.page_problems(doc.relative_to(ROOT).as_posix(), doc.read_text(),
                                                                     known)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("line,found", [
    ("Set `trainer.accumulate_grad_batches` to 4.", "`trainer.accumulate_grad_batches` is not a config key (did you "
                                                   "mean trainer.accumulate?)"),
    ("Run with `strategy=ddpp`.", "strategy has no option 'ddpp'"),
    ("Sweep `precision=32,bf17`.", "precision has no option 'bf17'"),
    ("Both: `logger=[csv,tensorbored]`.", "logger has no option 'tensorbored'"),
    ("`python train.py model/config=llama3 devices=2`", "model/config has no option 'llama3'"),
    ("See conf/strategy/fsdpp.yaml.", "conf/strategy/fsdpp.yaml: no such file"),
    ("The test is [here](tests/strategy/test_nothing.py).", "tests/strategy/test_nothing.py: no such file"),
    ("The six plugin groups are these.", "the number of plugin groups is not written by hand"),
    ("Every plugin (accelerator, strategy, precision, checkpoint_io, cluster) is one key.",
     "lists the plugin groups without fault_tolerance"),
    ("`model.config.num_experts_per_tok=4` and `strategy.tensor_parallel_size=2`", None),  # a family's field, a key
    ("`callbacks.profiler.ranks=[0,1]`, `trust.allow=[mypkg.]`, `strategy=my_strategy`", None),
    ("Open `outputs/<name>/metrics.csv` or conf/X/Y.yaml", None),  # placeholders
    ("Shown on purpose: `strategy=ddpp` <!-- wrong on purpose -->", None),
])
def test_a_claim_in_prose_that_does_not_hold_is_found_with_its_line(line, found):
    problems = claims.page_problems("docs/page.md", f"# Title\n\n{line}\n", claims.load_known())
    if found is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problems[0].startswith("docs/page.md:3: ") and found in problems[0], problems


def test_the_options_page_must_name_every_option():
    known = claims.load_known()
    page = (ROOT / "docs" / "options.md").read_text().replace("`olmoe`", "OLMoE")
    assert claims.page_problems("docs/options.md", page, known) == ["docs/options.md:1: the options page does not name "
                                                                    "model/config=olmoe"]


@pytest.mark.slow
def test_make_docs_fails_naming_the_page_and_line_of_an_unknown_key(tmp_path):
    """The site built from a copy of the tree whose data page names a key that does not exist."""
    for entry in ROOT.iterdir():
        if entry.name not in ("docs", "site", ".git") and not entry.name.startswith(".venv"):
            (tmp_path / entry.name).symlink_to(entry)
    subprocess.run(["cp", "-r", str(ROOT / "docs"), str(tmp_path / "docs")], check=True)
    page = tmp_path / "docs" / "data.md"
    page.write_text(page.read_text() + "\nSet `data.batch_sise=4`.\n")
    line = len(page.read_text().splitlines())
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode != 0
    assert f"docs/data.md:{line}: `data.batch_sise` is not a config key (did you mean data.batch_size?)" in result.stderr


def test_the_known_keys_do_not_depend_on_whether_a_test_had_imported_the_plugin(monkeypatch):
    """The example plugin's signatures decide which of its keys are open: CI once found the page stale
    because a test on the same worker had installed and imported the plugin first."""
    before = pages.generated(matrix=False)[pages.KNOWN_KEYS]
    monkeypatch.syspath_prepend(str(pages.PLUGIN_ROOT))
    import framework_plugin_example.strategy  # noqa: F401  what the plugin package's tests leave imported
    assert pages.generated(matrix=False)[pages.KNOWN_KEYS] == before
