"""Chat templates: a conversation (a list of {role, content} messages) rendered to the text a
model trains on, and where in that text each response lies, so that only responses are scored.

A template is Jinja, as Hugging Face tokenizers ship it (`chat_template` in tokenizer_config.json,
or chat_template.jinja beside it), rendered the way `transformers` renders it (a sandboxed
environment, trim_blocks and lstrip_blocks, `raise_exception`, the tokenizer's `bos_token` /
`eos_token` / `pad_token` / `unk_token`, the `add_generation_prompt` flag). The rendered text is
encoded as `apply_chat_template` encodes it: nothing added to what the template writes (a template
that writes the bos gets one bos).

Which characters are scored: where the template marks the assistant's text with `{% generation %}`
blocks, those (transformers' assistant mask, what trl's SFTTrainer scores with
assistant_only_loss). Otherwise a response's span is found by rendering the conversation up to it:
the text of the messages before it plus the generation prompt is where it starts, the text of the
messages up to and including it is where it ends (its end-of-turn marker is scored too, so the
model learns to stop). This needs nothing from the template beyond rendering a prefix of a
conversation as a prefix of the whole, which every ordinary template does; one that does not is
refused, named. A token is scored where it overlaps a scored span (transformers' rule).
"""
from __future__ import annotations

import datetime
import functools
import json
import re
from pathlib import Path

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from framework.config.resolvers import BYTES
from framework.data.special_tokens import TOKENIZER_CONFIG, read_json
from framework.data.tokenizer import loaded_tokenizer
from framework.errors import ConfigError

# Templates that ship with the framework, by name (data.chat_template=chatml).
BUILT_IN = {
    # ChatML (Qwen, many others): <|im_start|>role\ncontent<|im_end|>\n per message.
    "chatml": ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
               "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
               "{% endif %}"),
}
TEMPLATE_FILE = "chat_template.jinja"
# Special-token spellings a template writes into the text: <|im_start|>, <|eot_id|>, </s>, [INST], <end_of_turn>
_MARKER = re.compile(r"<\|[^|<>\s]+\|>|</?s>|\[/?INST\]|<\|?[a-z_]*(?:turn|eot|im)[a-z_]*\|?>")


# What a `{% generation %}` block's text is wrapped in while rendering (private-use characters no
# message holds: a conversation holding one is refused), taken out again with their places noted.
GENERATION_START, GENERATION_END = "\ue000", "\ue001"
_GENERATION_TAG = re.compile(r"{%-?\s*generation\s*-?%}")


class Generation(Extension):
    """`{% generation %}...{% endgeneration %}`, Hugging Face's marks of the assistant's text (what
    trl's SFTTrainer scores with assistant_only_loss): rendered as its content between two marks
    that ChatTemplate.scored_text turns into spans."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_marked"), [], [], body).set_lineno(lineno)

    def _marked(self, caller) -> str:
        return GENERATION_START + caller() + GENERATION_END


def _unmarked(text: str) -> tuple[str, list[tuple[int, int]]]:
    """A rendering without its generation marks, and the (start, end) of each marked span in it."""
    spans, out, at = [], [], 0
    for piece in re.split(f"([{GENERATION_START}{GENERATION_END}])", text):
        if piece == GENERATION_START:
            spans.append([at, at])
        elif piece == GENERATION_END:
            spans[-1][1] = at
        else:
            out.append(piece)
            at += len(piece)
    return "".join(out), [(start, end) for start, end in spans if end > start]


@functools.lru_cache(maxsize=8)
def _compiled(source: str):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env.from_string(source)


def tokenizer_directory(tokenizer: str) -> Path | None:
    if str(tokenizer) == BYTES:
        return None
    path = Path(str(tokenizer)).expanduser()
    return path if path.is_dir() else path.parent


class ChatTemplate:
    """A compiled chat template and the special tokens it may name."""

    def __init__(self, source: str, origin: str, special_tokens: dict[str, str] | None = None):
        self.source, self.origin = source, origin
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        try:
            self.template = _compiled(source)
        except jinja2.TemplateSyntaxError as err:
            raise ConfigError(f"data.chat_template: the template ({origin}) is not valid Jinja (line {err.lineno}: "
                              f"{err.message}).") from err

    @classmethod
    def choose(cls, given: str | None, tokenizer: str) -> ChatTemplate:
        """The template `data.chat_template` names (a built-in name, a file, or Jinja inline), else
        the tokenizer's own; a tokenizer without one and no template given is refused."""
        directory = tokenizer_directory(tokenizer)
        config = {}
        if directory is not None and (directory / TOKENIZER_CONFIG).is_file():
            config = read_json(directory / TOKENIZER_CONFIG)
        special = {} if str(tokenizer) == BYTES else {
            f"{role}_token": text for role, text in loaded_tokenizer(str(tokenizer)).special.texts.items()}
        if given:
            given = str(given)
            if given in BUILT_IN:
                return cls(BUILT_IN[given], f"built-in {given}", special)
            if "{{" in given or "{%" in given:
                return cls(given, "given inline", special)
            path = Path(given).expanduser()
            if path.is_file():
                return cls(path.read_text(encoding="utf-8"), str(path), special)
            raise ConfigError(f"data.chat_template={given!r}: neither a built-in template ({', '.join(BUILT_IN)}), "
                              "a file, nor a Jinja template (inline templates contain {{ or {%).")
        if directory is not None and (directory / TEMPLATE_FILE).is_file():
            return cls((directory / TEMPLATE_FILE).read_text(encoding="utf-8"), str(directory / TEMPLATE_FILE),
                       special)
        source = config.get("chat_template")
        if isinstance(source, list):  # named templates: the default one
            source = next((t.get("template") for t in source if isinstance(t, dict) and t.get("name") == "default"),
                          None)
        if isinstance(source, str) and source:
            return cls(source, str(directory / TOKENIZER_CONFIG), special)
        where = "byte-level tokens have none" if directory is None else \
            f"{directory} has neither {TEMPLATE_FILE} nor a chat_template in {TOKENIZER_CONFIG}"
        raise ConfigError(f"data.chat_template: the tokenizer has no chat template ({where}); give one: "
                          f"data.chat_template=chatml (built in), a .jinja file, or a Jinja template inline.")

    @property
    def marks_generation(self) -> bool:
        """Whether the template marks the assistant's text with `{% generation %}` blocks."""
        return bool(_GENERATION_TAG.search(self.source))

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        return self._rendered(messages, add_generation_prompt)[0]

    def _rendered(self, messages: list[dict], add_generation_prompt: bool = False) -> tuple[str, list]:
        """The conversation's text and the spans its `{% generation %}` blocks marked."""
        if any(GENERATION_START in m["content"] or GENERATION_END in m["content"] for m in messages):
            raise ConfigError("data: a message holds the character U+E000 or U+E001, which the framework uses to find "
                              "a chat template's {% generation %} blocks; remove it from the data.")
        try:
            text = self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                        **self.special_tokens)
        except jinja2.TemplateError as err:
            raise ConfigError(f"data.chat_template: the template ({self.origin}) refuses a conversation with roles "
                              f"{', '.join(m['role'] for m in messages)}: {err}. Give conversations it accepts, or "
                              "another template (data.chat_template).") from err
        return _unmarked(text)

    def scored_text(self, messages: list[dict], scored_roles, last_only: bool = False
                    ) -> tuple[str, list[tuple[int, int]]]:
        """The conversation's text and the (start, end) character spans that are scored: where the
        template marks the assistant's text with `{% generation %}` and the assistant alone is
        scored, those blocks (transformers' assistant mask, trl's assistant_only_loss); else the
        messages of a scored role, each found by rendering the conversation up to it. `last_only`:
        the last of them alone (trl's completion_only_loss). A message the template leaves out (a
        role it does not know) is refused."""
        text, marked = self._rendered(messages)
        for message in messages:
            content = message["content"].strip()
            if content and content not in text:
                raise ConfigError(f"data: the chat template ({self.origin}) does not know the role "
                                  f"{message['role']!r}: it leaves that message out of the text. Rename the role "
                                  "(system, user, assistant) or give a template that knows it (data.chat_template).")
        if self.marks_generation and list(scored_roles) == ["assistant"]:
            return text, marked[-1:] if last_only else marked
        spans = []
        for i, message in enumerate(messages):
            if message["role"] not in scored_roles:
                continue
            before = self.render(messages[:i], add_generation_prompt=True)
            upto = self.render(messages[:i + 1])
            if not (text.startswith(before) and text.startswith(upto) and len(before) <= len(upto)):
                raise ConfigError(f"data.chat_template: the template ({self.origin}) renders the start of a "
                                  "conversation differently from the whole conversation, so the responses cannot "
                                  "be found in its text; give a template that renders each turn in place, or mark "
                                  "the assistant's text with {% generation %} blocks.")
            spans.append((len(before), len(upto)))
        return text, spans[-1:] if last_only else spans

    def markers(self) -> list[str]:
        """The template's own markers, in the order they appear: special-token spellings written into
        the text (`<|im_start|>`, `<|im_end|>`; `</s>`, `[INST]` ...), found by rendering a
        conversation and keeping what the messages do not hold."""
        text = self.render([{"role": "user", "content": "\x00"}, {"role": "assistant", "content": "\x00"}])
        return list(dict.fromkeys([*_MARKER.findall(text), *self.end_markers()]))

    def end_markers(self) -> list[str]:
        """The markers that end an assistant's reply: those in the text the template puts after it
        (ChatML's `<|im_end|>`, Llama 3's `<|eot_id|>`, `</s>`), or that whole text where it is one
        short marker of another spelling. What generation stops at."""
        end = self.turn_end()
        found = _MARKER.findall(end)
        return found or ([end] if end and not end.isspace() and len(end) < 32 else [])

    def turn_end(self) -> str:
        """The text the template puts after an assistant's reply (ChatML's `<|im_end|>`): where a
        generated reply stops. Empty when it puts none."""
        sentinel = "\x00reply\x00"
        text = self.render([{"role": "user", "content": "?"}, {"role": "assistant", "content": sentinel}])
        return text.split(sentinel, 1)[1].strip() if sentinel in text else ""
