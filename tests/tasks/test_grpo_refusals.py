"""task=grpo's bad inputs: each refused with exit 2 before launch naming the key where it can be known
then (settings out of range, a reward that is not trusted or reads a field the rows lack, completions
with no room in the context, layouts that cannot decode), and a reward function that raises or
answers wrongly during the run stops it with exit 2 naming the function and the prompt's row, the
last checkpoint kept. Also the prompt rows as data=prompt_files reads them, and the built-in rewards."""
from __future__ import annotations

import json
import re

import pytest

from framework.data.prompt_files import PLACE, PromptFiles
from framework.errors import ConfigError
from framework.tasks.grpo import GRPO
from framework.tasks.rewards import ExactMatch, Format, Length, final_answer
from tests.helpers.in_process import REPOSITORY, run_command

RECIPE = ["--config-dir", str(REPOSITORY / "recipes"),
          "--config-name", "grpo_arithmetic"]
FAST = ["trainer.progress_bar=false", "trainer.plot=false", "model.n_layer=1", "model.n_embd=32", "model.n_head=2"]


@pytest.mark.parametrize("kwargs,fragment", [
    ({"num_generations": 1}, "task.num_generations=1: an advantage is a completion's reward against its group's"),
    ({"temperature": 0}, "task.temperature=0"),
    ({"top_p": 0}, "task.top_p=0"),
    ({"loss": "ppo"}, "task.loss='ppo': choose one of grpo, dr_grpo, dapo, bnpo"),
    ({"scale_rewards": "rank"}, "task.scale_rewards='rank'"),
    ({"epsilon": 1.5}, "task.epsilon=1.5"),
    ({"rewards": ["nope"]}, "no built-in reward 'nope'"),
    ({"rewards": ["exact_match", "exact_match"]}, "exact_match listed twice"),
    ({"rewards": ["exact_match"], "reward_weights": [1.0, 2.0]}, "2 weights for 1 reward functions"),
])
def test_bad_settings_are_refused_naming_the_key(kwargs, fragment):
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        GRPO(tokenizer="bytes", **kwargs)


@pytest.mark.parametrize("override,fragment", [
    ("task.epsilon=-0.1", "task.epsilon=-0.1: must be a number >= 0"),
    ("task.temperature=-1", "task.temperature=-1: must be a number >= 0"),
    ("task.num_generations=1", "task.num_generations=1"),
    ("task.max_completion_tokens=30", "task.max_completion_tokens=30 with data.max_prompt_tokens=16: a prompt and its "
                                      "completion take up to 46 positions, the model's context holds 32"),
    ("task.rewards=[{_target_:os.system,_partial_:true}]", "task.rewards[0]._target_=os.system is not in the trusted"),
    ("task.stop=ab", "task.stop='ab': the tokenizer makes it 2 tokens"),
    ("strategy=pipeline", "decoding through stages is not built"),
    ("strategy=model_parallel", "the decoding of a split sequence is not built"),
])
def test_a_bad_setting_exits_2_before_launch_naming_the_key(tmp_path, override, fragment):
    extra = ["devices=2", "strategy.context_parallel_size=2"] if override == "strategy=model_parallel" else (
        ["devices=2"] if override == "strategy=pipeline" else [])
    result = run_command(["train", *RECIPE, override, *extra, *FAST], tmp_path)
    assert result.returncode == 2, result.stderr[-1500:]
    assert fragment in " ".join(result.stderr.split()), result.stderr[-1500:]
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob("checkpoints"))


def _rows(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_a_reward_reading_a_field_the_rows_lack_is_refused_before_launch(tmp_path):
    (tmp_path / "mine.py").write_text("def solved(completions, solution, **kw):\n    return [0.0] * len(completions)\n")
    result = run_command(["train", *RECIPE, *FAST, "task.rewards=[{_target_:mine.solved,_partial_:true}]",
                          "trust.allow=[mine.]"], tmp_path, env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 2, result.stderr[-1500:]
    said = " ".join(result.stderr.split())
    assert "the reward solved reads the field 'solution', which 2582 row(s) of the prompt files lack (the first: " \
           "arithmetic_prompts.jsonl line 1)" in said, said


REWARDS = '''
calls = 0

def late(completions, answer, **kw):
    """Raises on the prompt 18+37= (answer 55), from the 30th call on: after the step-20 checkpoint."""
    global calls
    calls += 1
    if calls >= 30 and "55" in answer:
        raise ValueError("cannot score 55")
    return [float(len(c)) for c in completions]

def short(completions, **kw):
    return [1.0]
'''


@pytest.mark.parametrize("function,fragment", [
    ("late", "the reward function late raised ValueError: cannot score 55 on the prompt of arithmetic_prompts.jsonl "
             "line 365"),
    ("short", "the reward function short returned 1 values for 64 completions; it must return one per completion"),
])
def test_a_reward_that_fails_during_the_run_stops_it_naming_the_function_and_row(tmp_path, function, fragment):
    (tmp_path / "mine.py").write_text(REWARDS)
    result = run_command(["train", *RECIPE, *FAST, f"task.rewards=[{{_target_:mine.{function},_partial_:true}}]",
                          "trust.allow=[mine.]", "name=failing", "trainer.max_steps=60", "data.shuffle=false",
                          "callbacks.checkpoint.every_n_steps=20", "trainer.val_every=1000",
                          "trainer.val_at_start=false"], tmp_path, env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 2, result.stderr[-1500:]
    assert fragment in " ".join(result.stderr.split()), result.stderr[-1500:]
    if function == "late":  # the checkpoint of step 20 stays, to resume from once fixed
        assert (tmp_path / "outputs" / "failing" / "checkpoints" / "step_000020").is_dir()


def test_prompt_rows_are_read_with_their_fields_and_places(tmp_path):
    files = _rows(tmp_path / "p.jsonl", [{"prompt": "2+2=", "answer": "4", "level": 1},
                                         {"prompt": [{"role": "user", "content": "3+3?"}], "answer": "6"}])
    data = PromptFiles(files=files, val_percent=0, chat_template="chatml", max_prompt_tokens=6)
    assert data.problems() == []
    dataset = data.train_dataset()
    batch = data.collate()([dataset[0], dataset[1]])
    assert batch["prompts"][0] == "2+2=" and batch["prompts"][1][0]["content"] == "3+3?"
    assert batch["rows"][0] == {"answer": "4", "level": 1, PLACE: "p.jsonl line 1"}
    assert batch["prompt_lengths"].tolist() == [4, 6]  # the chat prompt kept its last 6 tokens (trl cuts the left)
    rendered = "<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n".encode()
    assert batch["prompt_ids"][1].tolist() == list(rendered[-6:])


def test_rows_without_a_prompt_are_refused_naming_the_first(tmp_path):
    files = _rows(tmp_path / "p.jsonl", [{"prompt": "2+2=", "answer": "4"}, {"question": "x", "answer": "1"}])
    problems = PromptFiles(files=files).problems()
    assert len(problems) == 1 and "1 row(s) have no prompt there" in problems[0] and "p.jsonl line 2" in problems[0]


@pytest.mark.parametrize("text,answer", [("47", "47"), ("so the sum is 1,234.", "1234"), ("x #### 12", "12"),
                                         ("\\boxed{7} then 9", "7"), ("no number", "no number")])
def test_the_final_answer_is_found_as_the_exact_match_reads_it(text, answer):
    assert final_answer(text) == answer


def test_the_built_in_rewards_score_each_completion():
    assert ExactMatch()(completions=["47\n", "46\n", [{"role": "assistant", "content": "47"}]],
                        answer=["47", "47", "47"]) == [1.0, 0.0, 1.0]
    assert Format()(completions=["work\n#### 5", "5"]) == [1.0, 0.0]
    assert Length(target=4)(completions=["abcd", "ab", "abcdef"]) == [0.0, -0.5, -0.5]
    with pytest.raises(ConfigError, match="not a regular expression"):
        Format(pattern="(")
