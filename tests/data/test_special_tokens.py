"""The tokens a model sees are the ones transformers and trl give it: for tokenizer directories shaped
like five real families' (tests/helpers/families.py), the ids of plain text, of a text document, of a
conversation through the tokenizer's own template and of a preference pair equal AutoTokenizer's and
trl's; generation stops at the family's end tokens; a template's {% generation %} blocks are the
scored tokens as transformers' assistant mask has them; bad settings files are refused naming the
file and the token."""
from __future__ import annotations

import json

import pytest

from framework.data.chat_files import ChatFiles
from framework.data.chat_template import ChatTemplate
from framework.data.preference_files import PreferenceFiles
from framework.data.text_files import TextEncoder
from framework.data.tokenizer import Tokenizer
from framework.errors import ConfigError
from tests.helpers.families import FAMILIES, LLAMA3_TEMPLATE, make_family

transformers = pytest.importorskip("transformers")

TEXTS = ["def f(x):\n    return x  # déjà vu", "  leading spaces\n\n\ttabs   and   runs 12345 don't", "a"]
CONVERSATION = [{"role": "user", "content": "What does json.dumps do?"},
                {"role": "assistant", "content": "It serializes an object to a JSON string."},
                {"role": "user", "content": "And json.loads?"},
                {"role": "assistant", "content": "The reverse: a JSON string to an object."}]
PAIR = {"prompt": "Q: what is 2+2?", "chosen": " 4", "rejected": " 5"}


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {family: make_family(family, root / family) for family in FAMILIES}


def hub(directory):
    return transformers.AutoTokenizer.from_pretrained(str(directory))


@pytest.mark.parametrize("family", FAMILIES)
def test_text_and_documents_get_the_familys_special_tokens(families, family):
    ours, theirs = Tokenizer(str(families[family])), hub(families[family])
    assert [ours.bos_id, ours.eos_id] == [theirs.bos_token_id, theirs.eos_token_id]
    assert ours.pad_id == (theirs.pad_token_id if theirs.pad_token_id is not None else theirs.eos_token_id)
    for text in TEXTS:
        assert ours.encode([text], special=True)[0] == theirs(text)["input_ids"], text
        assert ours.encode([text])[0] == theirs(text, add_special_tokens=False)["input_ids"], text
    # a document of a packed stream: as trl's SFTTrainer makes a text row, the eos text appended
    documents = TextEncoder(str(families[family]), "text", add_eos=True)("file", TEXTS)
    for text, document in zip(TEXTS, documents):
        assert document.tokens.tolist() == theirs(text + theirs.eos_token)["input_ids"], text
    starts = {"gpt2": None, "llama2": "<s>", "llama3": "<|begin_of_text|>", "qwen2.5": None, "gemma": "<bos>"}
    first = documents[0].tokens[0]
    assert (ours.decode([first]) == starts[family]) if starts[family] else first != ours.bos_id


def test_the_end_tokens_come_from_the_tokenizers_own_files(families):
    """Llama 3's eos is <|eot_id|> and generation also stops at <|end_of_text|> (its
    generation_config.json); Qwen2.5-Instruct's eos is <|im_end|>, not <|endoftext|> (its pad);
    Gemma stops at <eos> and <end_of_turn>."""
    def named(family, ids):
        tokenizer = Tokenizer(str(families[family]))
        return [tokenizer.decode([i]) for i in ids(tokenizer)]

    assert named("llama3", lambda t: t.stop_ids) == ["<|eot_id|>", "<|end_of_text|>"]
    assert named("qwen2.5", lambda t: [t.eos_id, t.pad_id, *t.stop_ids]) == ["<|im_end|>", "<|endoftext|>",
                                                                            "<|im_end|>", "<|endoftext|>"]
    assert named("gemma", lambda t: t.stop_ids) == ["<eos>", "<end_of_turn>"]
    assert named("gpt2", lambda t: t.stop_ids) == ["<|endoftext|>"]


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "gpt2"])
def test_a_conversation_through_the_tokenizers_own_template(families, family, tmp_path):
    """The template writes the bos itself where the family has one (one bos, not two)."""
    theirs = hub(families[family])
    rows = tmp_path / "chat.jsonl"
    rows.write_text(json.dumps({"messages": CONVERSATION}) + "\n")
    data = ChatFiles(files=str(rows), tokenizer=str(families[family]), chat_template=None, block_size=512,
                     cache_dir=str(tmp_path / "cache"))
    ids, _ = data.encoder().tokenise({"messages": CONVERSATION}, data.template)
    assert ids == theirs.apply_chat_template(CONVERSATION, tokenize=True, return_dict=True)["input_ids"]
    if theirs.bos_token_id is not None:
        assert ids.count(theirs.bos_token_id) == 1 and ids[0] == theirs.bos_token_id


@pytest.mark.parametrize("family", FAMILIES)
def test_a_preference_pair_is_tokenised_as_trls_dpo_trainer_does(families, family, tmp_path):
    """Text: each of prompt, prompt + chosen + eos, prompt + rejected + eos as tokenizer(text) has it
    (trl's add_eos and _tokenize), the prompt where the ids part. Messages: apply_chat_template."""
    data_utils = pytest.importorskip("trl.data_utils")
    theirs = hub(families[family])
    rows = [PAIR]
    if family != "gpt2":
        rows.append({"prompt": CONVERSATION[:1], "chosen": CONVERSATION[1:2],
                     "rejected": [{"role": "assistant", "content": "No idea."}]})
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = PreferenceFiles(files=str(path), tokenizer=str(families[family]), block_size=256,
                           cache_dir=str(tmp_path / "cache"))
    for row in rows:
        if isinstance(row["chosen"], str):
            def whole(response):
                return response if response.endswith(theirs.eos_token) else response + theirs.eos_token
            prompt = data_utils._tokenize(theirs, row["prompt"])["input_ids"]
            chosen = data_utils._tokenize(theirs, row["prompt"] + whole(row["chosen"]))["input_ids"]
            rejected = data_utils._tokenize(theirs, row["prompt"] + whole(row["rejected"]))["input_ids"]
        else:
            prompt = data_utils._tokenize(theirs, row["prompt"], add_generation_prompt=True)["input_ids"]
            chosen = data_utils._tokenize(theirs, row["prompt"] + row["chosen"])["input_ids"]
            rejected = data_utils._tokenize(theirs, row["prompt"] + row["rejected"])["input_ids"]
        shared = min(data_utils.common_prefix_length(prompt, chosen), data_utils.common_prefix_length(prompt, rejected))
        assert data.encoder().tokenise(row) == (prompt[:shared], chosen[shared:], rejected[shared:]), row


def test_generation_blocks_are_the_scored_tokens_as_transformers_masks_them(families, tmp_path):
    """A template whose {% generation %} blocks leave the end-of-turn token out (unlike the span the
    framework finds by rendering prefixes): the scored tokens are transformers' assistant mask."""
    marked = LLAMA3_TEMPLATE.replace(
        "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}",
        "'<|end_header_id|>\n\n' }}{% if message['role'] == 'assistant' %}{% generation %}"
        "{{ message['content'] | trim }}{% endgeneration %}{% else %}{{ message['content'] | trim }}{% endif %}"
        "{{ '<|eot_id|>' }}")
    assert marked != LLAMA3_TEMPLATE
    directory = families["llama3"]
    theirs = hub(directory)
    out = theirs.apply_chat_template(CONVERSATION, chat_template=marked, tokenize=True, return_dict=True,
                                     return_assistant_tokens_mask=True)
    rows = tmp_path / "chat.jsonl"
    rows.write_text(json.dumps({"messages": CONVERSATION}) + "\n")
    for turns, mask in (("all", out["assistant_masks"]), ("last", None)):
        data = ChatFiles(files=str(rows), tokenizer=str(directory), chat_template=marked, scored_turns=turns,
                         block_size=512, cache_dir=str(tmp_path / "cache"))
        ids, labels = data.encoder().tokenise({"messages": CONVERSATION}, data.template)
        assert ids == out["input_ids"]
        scored = [label != -100 for label in labels]
        if mask is not None:
            assert scored == [bool(m) for m in mask]
            assert theirs.decode([i for i, s in zip(ids, scored) if s]) == \
                "It serializes an object to a JSON string.The reverse: a JSON string to an object."
        else:  # the last reply alone: trl's completion_only_loss with the rest as the prompt
            assert theirs.decode([i for i, s in zip(ids, scored) if s]) == "The reverse: a JSON string to an object."
    plain = ChatTemplate(LLAMA3_TEMPLATE, "plain", {"bos_token": "<|begin_of_text|>"})
    _, spans = plain.scored_text(CONVERSATION, ["assistant"])
    text = plain.render(CONVERSATION)
    assert [text[s:e] for s, e in spans][0].endswith("<|eot_id|>")  # without marks: the end of turn scored too


def test_bad_settings_files_are_refused_naming_the_file_and_the_token(families, tmp_path):
    directory = tmp_path / "llama2"
    directory.mkdir()
    (directory / "tokenizer.json").write_bytes((families["llama2"] / "tokenizer.json").read_bytes())
    config = json.loads((families["llama2"] / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|end|>"}))
    with pytest.raises(ConfigError, match=r"tokenizer_config.json names eos_token='<\|end\|>', a token its "
                                          r"tokenizer.json does not hold"):
        Tokenizer(str(directory))
    from tests.helpers.in_process import run_command

    text = tmp_path / "text.jsonl"
    text.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS * 4))
    refused = run_command(["train", "data=text_files", f"data.files={text}", f"data.tokenizer={directory}",
                           "trainer.max_steps=1", "hydra.run.dir=run"], tmp_path)
    assert refused.returncode == 2 and "names eos_token='<|end|>'" in refused.stderr, refused.stderr[-2000:]
    assert not (tmp_path / "run").exists()
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": "{% for m in messages %}"}))
    rows = tmp_path / "chat.jsonl"
    rows.write_text(json.dumps({"messages": CONVERSATION}) + "\n")
    with pytest.raises(ConfigError, match=r"the template \(.*tokenizer_config.json\) is not valid Jinja"):
        ChatFiles(files=str(rows), tokenizer=str(directory), chat_template=None, cache_dir=str(tmp_path / "cache"))


def test_a_bare_tokenizer_json_keeps_its_behaviour(tmp_path):
    """No settings files: nothing added to a text, the eos found by its usual names."""
    from tests.helpers.text_data import stdlib_documents, train_tokenizer

    directory = train_tokenizer(tmp_path / "bare", stdlib_documents(4, 2000))
    tokenizer = Tokenizer(str(directory))
    assert not tokenizer.special.tokenizer_settings and tokenizer.bos_id is None
    assert tokenizer.decode([tokenizer.eos_id]) == "<|endoftext|>"
    assert tokenizer.encode(["import os"], special=True) == tokenizer.encode(["import os"])


def test_generation_stops_at_any_of_the_familys_end_tokens(families):
    """Llama 3's generation_config.json stops at <|end_of_text|> as well as at its eos <|eot_id|>:
    a model that writes either stops there (framework/generation/decode.py)."""
    import torch

    from framework.generation.decode import generate
    from framework.sampling import Sampling

    tokenizer = Tokenizer(str(families["llama3"]))

    class Writes(torch.nn.Module):
        block_size = 64

        def __init__(self, token: int):
            super().__init__()
            self.token, self.bias = token, torch.nn.Parameter(torch.zeros(tokenizer.vocab_size))

        def forward(self, ids, cache=None):
            return self.bias + torch.nn.functional.one_hot(torch.full(ids.shape, self.token), tokenizer.vocab_size)

    for stop in tokenizer.stop_ids:
        result = generate(Writes(stop), [5, 6], Sampling(max_new_tokens=8, temperature=0.0),
                          stop_ids=tokenizer.stop_ids)
        assert result.ids == [stop] and result.stopped
    other = generate(Writes(7), [5, 6], Sampling(max_new_tokens=8, temperature=0.0), stop_ids=tokenizer.stop_ids)
    assert other.ids == [7] * 8 and not other.stopped
