"""data=chat_files: conversations rendered with a chat template (built in, the tokenizer's own, or
given), only the responses scored, packed rows whose conversations do not see each other; bad
input named before launch."""
from __future__ import annotations

import json

import pytest
import torch

from framework.config.resolvers import example_data
from framework.data.chat_files import ChatFiles
from framework.data.chat_template import BUILT_IN, ChatTemplate
from framework.errors import ConfigError
from framework.models.gpt import GPT
from framework.tasks.fit_check import check_fit
from framework.tasks.language_modeling import LanguageModeling
from tests.helpers.in_process import run_command
from tests.helpers.text_data import train_tokenizer

pytest.importorskip("datasets")

CONVERSATIONS = [
    [{"role": "user", "content": "What does json.dumps do?"},
     {"role": "assistant", "content": "It serializes an object to a JSON string."}],
    [{"role": "system", "content": "Answer briefly."},
     {"role": "user", "content": "What is the os module for?"},
     {"role": "assistant", "content": "Operating system interfaces."},
     {"role": "user", "content": "And os.getcwd?"},
     {"role": "assistant", "content": "The current working directory."}],
    [{"role": "user", "content": "Name a sorting function."},
     {"role": "assistant", "content": "sorted(iterable, key=None, reverse=False)"}],
] * 4
# A template in the style of Llama 3: a beginning-of-text token, headers per role, an end-of-turn token.
HEADERS = ("{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + "
           "m['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
           "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")


def write_rows(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def chat(tmp_path, rows=None, **kwargs):
    files = write_rows(tmp_path / "chat.jsonl", rows if rows is not None else [{"messages": c} for c in CONVERSATIONS])
    kwargs.setdefault("chat_template", "chatml")
    kwargs.setdefault("block_size", 512)
    kwargs.setdefault("val_percent", 20)
    return ChatFiles(files=str(files), cache_dir=str(tmp_path / "cache"), batch_size=4, **kwargs)


def scored_text(row, decode) -> str:
    return decode([t for t in row["labels"].tolist() if t != -100])


def responses(conversation, end: str) -> str:
    return "".join(m["content"] + end for m in conversation if m["role"] == "assistant")


def decode_bytes(ids) -> str:
    return bytes(ids).decode()


def test_the_loss_counts_the_responses_alone_and_each_turns_end(tmp_path):
    dm = chat(tmp_path, packing=False)
    rows = [dm.train_dataset()[i] for i in range(len(dm.train_dataset()))]
    template = ChatTemplate(BUILT_IN["chatml"], "chatml")
    by_text = {template.render(c): c for c in CONVERSATIONS}
    for row in rows:
        conversation = by_text[decode_bytes(row["input_ids"].tolist())]  # the whole conversation, rendered
        assert scored_text(row, decode_bytes) == responses(conversation, "<|im_end|>\n")
    assert {len(by_text[decode_bytes(r["input_ids"].tolist())]) for r in rows} == {2, 5}
    batch = dm.collate()(rows[:3])
    assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape
    assert (batch["labels"][batch["attention_mask"] == 0] == -100).all()


def test_one_turn_rows_with_a_system_message_from_the_row_or_the_settings(tmp_path):
    rows = [{"prompt": "Say hi.", "response": "Hi."},
            {"prompt": "Say bye.", "response": "Bye.", "system": "Be polite."}] * 5
    dm = chat(tmp_path, rows, packing=False, system_prompt="Be brief.", val_percent=10)
    texts = sorted({decode_bytes(dm.train_dataset()[i]["input_ids"].tolist()) for i in range(len(dm.train_dataset()))})
    assert texts == ["<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nSay hi.<|im_end|>\n"
                     "<|im_start|>assistant\nHi.<|im_end|>\n",
                     "<|im_start|>system\nBe polite.<|im_end|>\n<|im_start|>user\nSay bye.<|im_end|>\n"
                     "<|im_start|>assistant\nBye.<|im_end|>\n"]


@pytest.mark.parametrize("where", ["tokenizer_config", "named_list", "jinja_file"])
def test_the_tokenizers_own_template_with_its_special_tokens(tmp_path, where):
    from tokenizers import AddedToken, Tokenizer

    texts = [m["content"] for c in CONVERSATIONS for m in c] * 3
    directory = train_tokenizer(tmp_path / "tok", texts, vocab_size=320)
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    specials = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tokenizer.add_special_tokens([AddedToken(s, special=True) for s in specials])
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"bos_token": {"content": "<|begin_of_text|>"}, "eos_token": "<|eot_id|>"}
    if where == "tokenizer_config":
        config["chat_template"] = HEADERS
    elif where == "named_list":
        config["chat_template"] = [{"name": "tool_use", "template": "{{ raise_exception('not this one') }}"},
                                   {"name": "default", "template": HEADERS}]
    else:
        (directory / "chat_template.jinja").write_text(HEADERS)
    (directory / "tokenizer_config.json").write_text(json.dumps(config))

    dm = chat(tmp_path, packing=False, chat_template=None, tokenizer=str(directory))
    row = dm.train_dataset()[0]
    ids = row["input_ids"].tolist()
    decode = lambda i: tokenizer.decode(i, skip_special_tokens=False)  # noqa: E731
    assert ids[0] == tokenizer.token_to_id("<|begin_of_text|>")  # a special token is one id
    assert ids.count(tokenizer.token_to_id("<|eot_id|>")) == decode(ids).count("<|eot_id|>") >= 2
    conversation = next(c for c in CONVERSATIONS if decode(ids).endswith(c[-1]["content"] + "<|eot_id|>"))
    assert scored_text(row, decode) == responses(conversation, "<|eot_id|>")


def test_a_template_with_generation_marks_renders_their_content(tmp_path):
    marked = HEADERS.replace("m['content'] | trim + '<|eot_id|>' }}",
                             "'' }}{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] | trim + "
                             "'<|eot_id|>' }}{% endgeneration %}{% else %}{{ m['content'] | trim + '<|eot_id|>' }}"
                             "{% endif %}")
    plain, with_marks = ChatTemplate(HEADERS, "plain", {"bos_token": "<s>"}), ChatTemplate(marked, "marked",
                                                                                            {"bos_token": "<s>"})
    assert with_marks.scored_text(CONVERSATIONS[1], ["assistant"]) == plain.scored_text(CONVERSATIONS[1], ["assistant"])


def packed_and_alone(model, dm):
    """Logits of each conversation (and of each row's padding) inside its packed row, and alone."""
    for row in (dm.train_dataset()[i] for i in range(len(dm.train_dataset()))):
        positions = row["position_ids"]
        starts = [i for i in range(len(positions)) if positions[i] == 0] + [len(positions)]
        with torch.no_grad():
            packed = model(input_ids=row["input_ids"][None], position_ids=positions[None])
            packed = getattr(packed, "logits", packed)[0]
            for start, end in zip(starts[:-1], starts[1:]):
                alone = model(input_ids=row["input_ids"][None, start:end])
                yield packed[start:end], getattr(alone, "logits", alone)[0]


def test_packed_conversations_do_not_attend_to_each_other_in_the_gpt(tmp_path):
    dm = chat(tmp_path, block_size=256)
    assert len(dm.train_dataset()[0]["input_ids"]) == 256
    torch.manual_seed(0)
    model = GPT(n_layer=2, n_embd=32, n_head=2, block_size=256).eval()
    pairs = list(packed_and_alone(model, dm))
    assert len(pairs) > len(dm.train_dataset()) >= 2
    for packed, alone in pairs:
        torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_packed_conversations_do_not_attend_to_each_other_in_hugging_face_models(tmp_path, family):
    from framework.models.hf_causal_lm import causal_lm

    fields = {"gpt2": {"n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 256},
              "llama": {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "max_position_embeddings": 256}}[family]
    torch.manual_seed(0)
    model = causal_lm({"model_type": family, "vocab_size": 256, **fields}).eval()
    dm = chat(tmp_path, block_size=256)
    pairs = list(packed_and_alone(model, dm))
    assert len(pairs) > len(dm.train_dataset()) >= 2
    for packed, alone in pairs:
        torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)


def test_packed_and_padded_rows_score_the_same_tokens_the_same(tmp_path):
    torch.manual_seed(0)
    model = GPT(n_layer=1, n_embd=32, n_head=2, block_size=512).eval()
    task = LanguageModeling()
    totals = {}
    for packing in (True, False):
        dm = chat(tmp_path / str(packing), packing=packing)
        dataset = dm.train_dataset()
        collate = dm.collate() or torch.utils.data.default_collate
        with torch.no_grad():
            sums = [task.validation_step(model, collate([dataset[i] for i in range(len(dataset))]))]
        totals[packing] = {k: sum(s[k] for s in sums).item() for k in sums[0]}
    assert totals[True]["tokens"] == totals[False]["tokens"] > 0
    assert totals[True]["loss_sum"] == pytest.approx(totals[False]["loss_sum"], rel=1e-5)


def test_the_example_that_ships_renders_and_packs():
    dm = ChatFiles(files=example_data("stdlib_chat.jsonl"), chat_template="chatml", block_size=512)
    assert dm.problems() == []
    rows = [json.loads(line) for line in open(example_data("stdlib_chat.jsonl"), encoding="utf-8")]
    assert len(rows) > 300 and all(m["role"] in ("user", "assistant") for r in rows for m in r["messages"])


ROLES_OF_TWO = ("{% for m in messages %}{% if m['role'] == 'user' %}Q: {{ m['content'] }}\n{% elif m['role'] == "
                "'assistant' %}A: {{ m['content'] }}\n{% endif %}{% endfor %}{% if add_generation_prompt %}A: "
                "{% endif %}")


@pytest.mark.parametrize("rows,kwargs,message", [
    ([{"text": "hello"}], {}, "chat.jsonl's rows have neither 'messages' (a list of {role, content}: OpenAI's), "
     "'conversations' (a list of {from, value}: ShareGPT's), 'instruction' and 'output' (with an optional 'input': "
     "Alpaca's), nor 'prompt' and 'response' (its first row has text); set data.messages_field"),
    ([{"messages": [{"role": "tool", "content": "42"}, {"role": "assistant", "content": "ok"}]}],
     {"chat_template": ROLES_OF_TWO}, "does not know the role 'tool': it leaves that message out of the text"),
    ([{"messages": CONVERSATIONS[0]}], {"chat_template": "{{ raise_exception('Conversation roles must alternate') }}"},
     "refuses a conversation with roles user, assistant: Conversation roles must alternate"),
    ([{"messages": CONVERSATIONS[0]}], {"block_size": 16}, "is 126 tokens, longer than data.block_size=16, and no "
     "response starts within the block: nothing in it is left to score. Raise data.block_size"),
    ([{"messages": CONVERSATIONS[0][:1]}], {}, "has no message of a scored role (assistant): nothing in it is left"),
    ([{"messages": [{"role": "user", "content": 3}]}], {}, "a turn must be {role, content} (OpenAI's) or {from, value} "
     "(ShareGPT's) with text values"),
    ([{"conversations": [{"from": "robot", "value": "hi"}]}], {}, "a ShareGPT turn is from 'robot', a speaker not known"),
])
def test_bad_rows_are_named_before_launch(tmp_path, rows, kwargs, message):
    problems = chat(tmp_path, rows, **kwargs).problems()
    assert len(problems) == 1 and message in problems[0], problems


@pytest.mark.parametrize("kwargs,message", [
    ({"chat_template": None}, "data.chat_template: the tokenizer has no chat template (byte-level tokens have none); "
     "give one: data.chat_template=chatml"),
    ({"chat_template": "chatmel"}, "data.chat_template='chatmel': neither a built-in template (chatml), a file, nor"),
    ({"chat_template": "{% for m in messages %}"}, "is not valid Jinja"),
    ({"format": "text"}, "data.format=text: chat data needs rows with fields"),
])
def test_bad_settings_are_refused_by_key(tmp_path, kwargs, message):
    with pytest.raises(ConfigError) as err:
        chat(tmp_path, **kwargs)
    assert message in str(err.value)


def test_conversations_with_nothing_to_score_can_be_left_out(tmp_path):
    rows = [{"messages": c} for c in CONVERSATIONS] + [{"messages": CONVERSATIONS[0][:1]}] * 3
    dm = chat(tmp_path, rows, packing=False, drop_unscorable=True, val_files=str(write_rows(tmp_path / "v.jsonl",
                                                                                            rows[:2])))
    assert len(dm.train_dataset()) == len(CONVERSATIONS)


def test_packing_needs_a_model_that_takes_position_ids(tmp_path):
    class NoPositions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(256, 8)

        def forward(self, input_ids, attention_mask=None):
            return self.emb(input_ids)

    with pytest.raises(ConfigError, match="data.packing=true: the data packs several samples into each row and keeps "
                                          "them apart by position_ids, but the model \\(NoPositions\\) takes no "
                                          "position_ids. Set data.packing=false"):
        check_fit(NoPositions(), chat(tmp_path), LanguageModeling())
    check_fit(NoPositions(), chat(tmp_path / "padded", packing=False), LanguageModeling())  # padded rows: no refusal


@pytest.mark.slow
def test_a_role_the_template_does_not_know_exits_2_before_the_run_directory_exists(tmp_path):
    files = write_rows(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "hi"},
                                                               {"role": "bot", "content": "hello"}]}] * 10)
    template = tmp_path / "two_roles.jinja"
    template.write_text(ROLES_OF_TWO)
    result = run_command(["train", "data=chat_files", f"data.files={files}", f"data.chat_template={template}",
                          "data.scored_roles=[bot]", "trainer.max_steps=2", "hydra.run.dir=run"], tmp_path)
    assert result.returncode == 2, result.stderr
    assert "does not know the role 'bot'" in result.stderr and not (tmp_path / "run").exists()


def test_the_chat_shapes_people_have_give_the_same_conversation(tmp_path):
    """OpenAI's messages, ShareGPT's conversations, Alpaca's instruction/input/output and a prompt and
    response, as JSON lines or a pretty-printed JSON array: one conversation, the same tokens."""
    import json

    question, answer = "What does os.path.join do?", "It joins path components."
    shapes = {
        "openai.jsonl": {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]},
        "sharegpt.jsonl": {"conversations": [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]},
        "alpaca.json": {"instruction": "What does os.path.join do?", "input": "", "output": answer},
        "prompt.jsonl": {"prompt": question, "response": answer},
    }
    rendered = {}
    for name, row in shapes.items():
        folder = tmp_path / name.split(".")[0]
        folder.mkdir()
        if name.endswith(".json"):  # Alpaca ships a pretty-printed array
            (folder / name).write_text(json.dumps([row] * 40, indent=2))
        else:
            (folder / name).write_text("".join(json.dumps(row) + "\n" for _ in range(40)))
        data = ChatFiles(files=str(folder / name), cache_dir=str(tmp_path / "cache"), block_size=128, packing=False,
                         val_files=str(folder / name), chat_template="chatml")
        assert data.problems() == [], name
        rendered[name] = data.train_dataset()[0]
    for name, sample in rendered.items():
        assert torch.equal(sample["input_ids"], rendered["openai.jsonl"]["input_ids"]), name
        assert torch.equal(sample["labels"], rendered["openai.jsonl"]["labels"]), name
    alpaca = ChatFiles(files=str(tmp_path / "alpaca" / "alpaca.json"), cache_dir=str(tmp_path / "cache"),
                       block_size=128, chat_template="chatml")
    with_input = alpaca.fields.conversation({"instruction": "Sum", "input": "1 2", "output": "3"})
    assert with_input[0] == {"role": "user", "content": "Sum\n\n1 2"}


def test_testing_chat_data_without_a_test_split_names_its_own_keys():
    """The hint names this data's keys (not other datasets'), and for a trained run it does not send
    the user to data.test_percent, which would then be refused as an overlap."""
    from framework.loop.state import RunMode
    from framework.preflight import prepare
    from tests.conftest import compose_cfg

    with pytest.raises(ConfigError) as refused:
        prepare(compose_cfg(["data=chat_files"]), mode=RunMode("test"))
    text = " ".join(str(refused.value).split())
    assert "framework test: the data (ChatFiles) has no test split" in text and "data.test_files=PATH" in text
    assert "digits" not in text and "stdlib_text" not in text
    assert "raising it now would test on documents it trained on" in text
    with pytest.raises(ConfigError) as at_end:
        prepare(compose_cfg(["data=chat_files", "trainer.test_at_end=true"]))
    assert "Give it one: data.test_files=PATH (files of their own), or data.test_percent=10" in str(at_end.value)
