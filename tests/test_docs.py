"""Every `python train.py ...` command shown in README.md and docs/ composes and validates; the site
builds from docs/ with no warning (no broken link, no page left out)."""
from __future__ import annotations

import re
import shlex

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from framework.config.overrides import normalize_overrides
from framework.errors import ConfigError
from framework.preflight import prepare
from tests.conftest import ROOT, compose_cfg
from tests.helpers.in_process import run_command

DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def shown_lines(pattern: str) -> list[tuple[str, str]]:
    found = []
    for doc in DOC_PAGES:
        in_code = False
        for line in doc.read_text().splitlines():
            if line.startswith("```"):
                in_code = not in_code
                continue
            match = re.match(pattern, line)
            if in_code and match:
                found.append((doc.name, match.group(1).split(" #")[0].strip()))
    return found


# Commands in docs/extending.md that need the reader's own package (mypkg, my_configs) or the
# example plugin installed (its options are run by tests/extension/test_plugin_package.py), or the
# reader's own files (docs/your-model.md's files and commands run in tests/test_your_model_doc.py).
NEEDS_A_PLUGIN = ("mypkg", "my_configs", "cluster=mysched", "hooked_ddp", "checkpoint_io=bucket", "my-tokenizer",
                  "data.tokenizer=./tok", "corpus/**/*.jsonl.gz",  # docs/data.md's corpus and tokenizer: run by
                  # tests/cli/test_prepare_data.py
                  "task.teacher=outputs/teacher")  # the teacher the command before trains: tests/tasks/test_distillation.py


def shown_commands() -> list[tuple[str, str]]:
    return [(d, a) for d, a in shown_lines(r"^\s*(?:\$ )?python train\.py(.*)$")
            if not any(marker in a for marker in NEEDS_A_PLUGIN)]


# `framework run NAME ...` and `framework plan ...` with a built-in recipe or the shipped config
# (lines with placeholders such as RECIPE or a user's own file are not runnable as shown).
RECIPE_COMMANDS = [(d, a) for d, a in shown_lines(r"^\s*(?:\$ )?framework (run .*|plan.*)$")
                   if "RECIPE" not in a and "OVERRIDES" not in a and "my_experiment" not in a and ".yaml" not in a
                   and "model.pretrained=" not in a  # a directory an earlier command writes (run as written below)
                   and "ckpt_path=outputs/arith_sft" not in a]  # stage 1's weights: run by tests/tasks/test_grpo_runs.py


def test_the_readme_shows_framework_commands():
    assert len(RECIPE_COMMANDS) >= 4


@pytest.mark.parametrize("doc,args", RECIPE_COMMANDS, ids=[f"{d}: framework {a}" for d, a in RECIPE_COMMANDS])
def test_shown_framework_command_is_valid(doc, args):
    from framework.config.compose import compose, sweep_variants
    from framework.paths import conf_dir, find_recipe

    argv = shlex.split(args)
    command, argv = argv[0], [a for a in argv[1:] if a != "-m"]
    if command == "run" or argv[:1] == ["-r"]:
        name = argv[1] if argv[:1] == ["-r"] else argv[0]
        argv = argv[2:] if argv[:1] == ["-r"] else argv[1:]
        recipe = find_recipe(name)
        config_dir, config_name = recipe.parent, recipe.stem
    else:
        config_dir, config_name = conf_dir(), "train"
    for variant in sweep_variants(argv):
        prepare(compose(config_dir, config_name, variant))


COMMANDS = shown_commands()


def test_the_readme_shows_commands():
    assert len(COMMANDS) >= 10


@pytest.mark.parametrize("doc,args", COMMANDS, ids=[f"{d}: {a}" for d, a in COMMANDS])
def test_shown_command_is_valid(doc, args):
    argv = [a for a in shlex.split(args) if a != "-m"]
    config_dir, config_name = None, "train"
    if "--config-dir" in argv:
        i = argv.index("--config-dir")
        config_dir = ROOT / argv[i + 1]
        config_name = argv[argv.index("--config-name") + 1]
        argv = [a for j, a in enumerate(argv) if j not in (i, i + 1) and a != "--config-name" and a != config_name]
    overrides = [a.split("=")[0] + "=" + a.split("=", 1)[1].split(",")[0] if "," in a and "[" not in a else a
                 for a in argv]  # a sweep: validate its first job
    # the README shows these as examples of errors
    expected_failure = ("trainer.max_steps=0" in overrides or any("widht" in o for o in overrides)
                        or overrides in (["strategy=ddpp"], ["trainer.max_step=3"]))
    if expected_failure and overrides in (["strategy=ddpp"], ["trainer.max_step=3"]):
        with pytest.raises(ConfigCompositionException):  # an unknown option or key: Hydra's composition refuses it
            compose_cfg(overrides)
        return
    if config_dir is None:
        cfg = compose_cfg(overrides)
    else:  # what `--config-dir` does: the recipes folder joins the search path of conf/
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            cfg = compose(config_name=config_name, overrides=[
                f"hydra.searchpath=[file://{ROOT / 'conf'}]", *normalize_overrides(overrides)])
    if expected_failure:  # the README shows these as examples of errors
        with pytest.raises(ConfigError):
            prepare(cfg)
    else:
        prepare(cfg)


def section_commands(title: str) -> list[str]:
    """The commands of the first code block under the heading `title` (a page's title or a section
    of it, in README.md or docs/), comments dropped."""
    text = next(t for t in (p.read_text() for p in DOC_PAGES) if re.search(rf"^#{{1,3}} {re.escape(title)}$", t, re.M))
    block = re.split(rf"^#{{1,3}} {re.escape(title)}\n", text, maxsplit=1, flags=re.M)[1]
    block = block.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


@pytest.mark.slow
def test_the_after_training_commands_run_as_written(tmp_path):
    import json

    commands = section_commands("After training: test, predict, generate, evaluate")
    assert [c.split()[1] for c in commands] == ["run", "test", "test", "test", "predict", "train", "generate"]
    outputs = {}
    for command in commands:
        args = shlex.split(command)
        if args[1] == "train":  # the page's GPT, its width and data cut: the generate below reads any run
            args += ["model.n_embd=64", "model.n_head=2", "model.block_size=64", "data.max_bytes=300000",
                     "trainer.max_steps=10", "trainer.val_batches=1", "trainer.plot=false"]
        result = run_command(args[1:], tmp_path)  # as typed, through the command's own entry, in this process
        assert result.returncode == 0, (command, result.stderr[-3000:])
        outputs[command] = result.stdout
        if args[1] in ("run", "test"):
            record = json.loads((tmp_path / "outputs/digits/test_metrics.json").read_text())
            assert record["metrics"]["test/accuracy"] > 0.9, command  # the digits are easy
    assert json.loads((tmp_path / "outputs/digits/test_metrics.json").read_text())["world_size"] == 1  # the last: --log
    logged = [line.split(",") for line in (tmp_path / "outputs/digits/metrics.csv").read_text().splitlines()]
    column = logged[0].index("test/accuracy")
    tested_at = [row[0] for row in logged[1:] if row[column]]
    assert tested_at == [str(json.loads((tmp_path / "outputs/digits/test_metrics.json").read_text())["step"])]
    rows = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 360 and sum(r["prediction"] == r["label"] for r in rows) / 360 > 0.9
    assert outputs[commands[-1]].startswith("def main(") and len(outputs[commands[-1]]) > len("def main(") + 20


@pytest.mark.slow
def test_the_conversation_commands_run_as_written(tmp_path):
    """docs/adapters.md's LoRA-on-conversations pipeline, each run shortened to a few steps."""
    import json

    commands = section_commands("Fine-tune on conversations")
    assert [c.split()[1] for c in commands] == ["run", "convert", "run", "generate", "convert"]
    outputs = {}
    for command in commands:
        args = shlex.split(command)[1:]
        if args[0] == "run":
            args += ["trainer.max_steps=4", "trainer.val_every=2", "trainer.val_batches=1", "trainer.plot=false"]
        result = run_command(args, tmp_path)  # as typed, through the command's own entry, in this process
        assert result.returncode == 0, (command, result.stderr[-3000:])
        outputs[args[0] + args[1]] = result
    assert json.loads((tmp_path / "base_hf/config.json").read_text())["n_positions"] == 256
    saved = torch.load(next((tmp_path / "outputs/chat/checkpoints").glob("step_*/model.pt")), weights_only=True)
    assert saved and all("lora_" in name for name in saved)  # the adapters alone
    reply = outputs["generateoutputs/chat"]
    assert "<|im_start|>" not in reply.stdout and "framework generate: outputs/chat/checkpoints/" in reply.stderr
    adapter = json.loads((tmp_path / "chat_adapters/adapter_config.json").read_text())
    assert adapter["r"] == 8 and set(adapter["target_modules"]) >= {"transformer.h.0.attn.c_attn"}

def test_the_chat_shapes_the_docs_show_are_the_ones_chat_files_reads():
    """The docs' example rows each read as a conversation (a user's turn, then the
    assistant's), and every page that describes chat data names all four shapes and the formats."""
    import json

    from framework.data.chat_files import Fields

    page = (ROOT / "docs" / "adapters.md").read_text()
    section = page[page.index("## Fine-tune on conversations"):]
    block = re.search(r"```json\n(.*?)```", section, re.S).group(1)
    rows = [json.loads(line) for line in block.splitlines() if line.strip()]
    fields = Fields("messages", "prompt", "response", "system", None)
    shapes = set()
    for row in rows:
        roles = [m["role"] for m in fields.conversation(row)]
        assert roles[-2:] == ["user", "assistant"], row
        shapes.add(next(iter(row)))
    assert shapes == {"messages", "conversations", "instruction", "prompt"}
    for page in (ROOT / "docs" / "adapters.md", ROOT / "docs" / "your-model.md", ROOT / "recipes" / "hf_lora_chat.yaml"):
        text = " ".join(page.read_text().split())
        for named in ("messages", "ShareGPT", "conversations", "Alpaca", "instruction", "prompt", "JSON arrays",
                      "parquet", "CSV"):
            assert named in text, (page.name, named)


def test_the_site_builds_without_a_warning(tmp_path):
    """`make docs`: mkdocs in strict mode fails on a link to a missing page or anchor, a page left out
    of the navigation, or a page the navigation names that does not exist."""
    import os
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "WARNING" not in result.stderr, result.stderr[-3000:]
    home = (tmp_path / "site" / "index.html").read_text()
    assert "The two commands" in home and 'href="getting-started/"' in home  # the README, its links made the site's
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name != "index.md":
            assert (tmp_path / "site" / page.stem / "index.html").is_file(), page.name


def shown_transcripts() -> list[tuple[str, str, str]]:
    """(page, command, shown output) of every `$ python train.py ...` transcript in a fenced block
    of README.md and docs/ that shows the message it prints ("..." where the text is cut)."""
    found = []
    for doc in DOC_PAGES:
        for block in re.findall(r"```[a-z]*\n(.*?)```", doc.read_text(), re.S):
            parts = re.split(r"^\$ (python train\.py.*)$", block, flags=re.M)
            found += [(doc.name, command, shown.strip()) for command, shown in zip(parts[1::2], parts[2::2])
                      if shown.strip()]
    return found


TRANSCRIPTS = shown_transcripts()


def test_the_docs_show_error_transcripts():
    assert {page for page, _, _ in TRANSCRIPTS} >= {"errors.md"} and len(TRANSCRIPTS) >= 4


@pytest.mark.parametrize("page,command,shown", TRANSCRIPTS, ids=[f"{p}: {c}" for p, c, _ in TRANSCRIPTS])
def test_a_shown_error_message_is_the_one_printed(page, command, shown, tmp_path):
    """The message a page shows is what the command prints today, up to its cuts ("..."): the
    arguments a class takes, the options of a group, the fix."""
    result = run_command(["train", *shlex.split(command)[2:]], tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    at = 0
    for piece in (p.strip() for p in shown.split("...")):
        found = result.stderr.find(piece, at)
        assert found >= 0, f"{page} shows {piece!r}; the command prints:\n{result.stderr}"
        at = found + len(piece)
