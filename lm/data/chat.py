"""Conversations for supervised fine-tuning: chat templates, and token ids with the assistant's tokens marked.

A conversation is a list of messages, each {"role": "system" | "user" | "assistant" | ..., "content": text}
(a record's data.messages_field: MessagesField reads it; or a prompt/response pair, `pair_messages`). A chat
template renders it as text, as Hugging Face transformers' apply_chat_template does: a Jinja template
(rendered by jinja2 in a sandbox, trim_blocks and lstrip_blocks, with raise_exception, strftime_now and a
tojson filter) given `messages`, `add_generation_prompt` and the special tokens (bos_token, eos_token, ...).
ChatTemplate.load takes a built-in name:

  plain   Question: <user>\\nAnswer: <assistant><eos>, turns separated by a blank line (a system message
          first, as it is, then a blank line)
  chatml  <|im_start|>role\\ncontent<|im_end|>\\n per message; the generation prompt <|im_start|>assistant\\n

or the path of a Hugging Face folder (its chat_template.jinja, else its tokenizer_config.json's chat_template),
of a tokenizer_config.json or of a .jinja file: absolute, else relative to the working directory, else to
$LM_DATA_DIR. A built-in's eos_token is the tokenizer's <|endoftext|> where it has one; the special tokens of a
folder (or a .jinja file) come from its tokenizer_config.json (the one beside the file).

The assistant's text is found by rendering prefixes: for the assistant message i, the conversation before it
with the generation prompt (the prompt the model continues at inference) and the conversation up to it; what
the second adds to the first is the assistant's turn, its end-of-turn marker included (the model learns to
stop). `pieces` cuts the whole conversation so, into (text, is the assistant's) pieces; each piece is
tokenised on its own and the ids joined (`encode_pieces`), so that the ids of a prompt are the ids the model
is given at inference. A template that does not render each conversation as a prefix of its continuation
(one that rewrites earlier turns once later ones exist) cannot mark the assistant's text this way: a UserError.
"""

import datetime
import json
import os
import pathlib
from collections.abc import Sequence
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox
import numpy as np

from lm.data.bpe import END_OF_TEXT, BPETokenizer
from lm.data.files import DATA_DIR_ENV
from lm.data.sources import Bad, ValueField
from lm.errors import UserError

ASSISTANT = "assistant"
BUILT_IN = {
    "plain": (
        "{%- for message in messages -%}"
        "{%- if message.role == 'system' -%}{{ message.content + '\\n\\n' }}"
        "{%- elif message.role == 'user' -%}{{ ('\\n\\n' if not loop.first and messages[loop.index0 - 1].role != "
        "'system' else '') + 'Question: ' + message.content + '\\nAnswer:' }}"
        "{%- elif message.role == 'assistant' -%}{{ ' ' + message.content + eos_token }}"
        "{%- else -%}{{ raise_exception('the plain template has no role ' + message.role) }}"
        "{%- endif -%}{%- endfor -%}"
    ),
    "chatml": (
        "{% for message in messages %}{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    ),
}
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
FORMS = f"a built-in ({', '.join(BUILT_IN)}) or a Hugging Face folder, its {CONFIG_FILE} or a .jinja file"

Messages = list[dict[str, str]]


class MessagesField(ValueField):
    """A record field holding a conversation: a list of {"role": str, "content": str} objects (or, as TFDS
    stores a sequence of them, one object of equal-length "role" and "content" lists)."""

    def read(self, value: Any) -> "Messages | Bad":
        if isinstance(value, dict) and isinstance(value.get("role"), list | tuple | np.ndarray):
            value = [{"role": role, "content": content} for role, content in zip(value["role"], value.get(
                "content", []), strict=False)]
        if not isinstance(value, list | tuple) or not value:
            kind = "empty" if isinstance(value, list | tuple) else type(value).__name__
            return Bad(f"field {str(self)!r} is {kind}, not a list of {{role, content}} messages")
        messages = []
        for number, message in enumerate(value, 1):
            texts = {key: text(message.get(key)) if isinstance(message, dict) else None for key in ("role", "content")}
            if not all(isinstance(t, str) for t in texts.values()):
                return Bad(f"message {number} of field {str(self)!r} is not a {{role, content}} object of strings")
            messages.append(texts)
        return messages


def text(value: Any) -> str | None:
    """value as a string (bytes decoded as UTF-8), or None if it is neither."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


def pair_messages(prompt: str, response: str) -> Messages:
    """A prompt/response record as a conversation: the user's prompt, the assistant's response."""
    return [{"role": "user", "content": prompt}, {"role": ASSISTANT, "content": response}]


def raise_exception(message: str):
    raise jinja2.TemplateError(message)


def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
           sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    """A sandbox like transformers' for chat templates."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda format: datetime.datetime.now().strftime(format)
    return env


def token_text(value: Any) -> str | None:
    """A tokenizer_config.json special token: a string, or an AddedToken object {"content": ...}."""
    return value.get("content") if isinstance(value, dict) else value if isinstance(value, str) else None


class ChatTemplate:
    """A Jinja chat template and the special tokens it is rendered with; name: where it came from."""

    def __init__(self, source: str, special_tokens: dict[str, str], name: str):
        self.source, self.special_tokens, self.name = source, special_tokens, name
        try:
            self.template = environment().from_string(source)
        except jinja2.TemplateError as e:
            raise UserError(f"data.chat_template={name}: the template does not parse ({type(e).__name__}: "
                            f"{e}): fix it, or use {FORMS}") from None

    @classmethod
    def load(cls, spec: str, tokenizer: BPETokenizer) -> "ChatTemplate":
        """A built-in by name, else the template at the path spec (module docstring)."""
        if spec in BUILT_IN:
            eos = END_OF_TEXT if tokenizer.end_of_text_id is not None else ""
            return cls(BUILT_IN[spec], {"eos_token": eos, "bos_token": ""}, spec)
        path = find_template(spec)
        config_path = path / CONFIG_FILE if path.is_dir() else path.with_name(CONFIG_FILE)
        config = read_config(config_path, spec) if config_path.is_file() else {}
        special = {key: token_text(value) for key, value in config.items() if key.endswith("_token")}
        special = {key: value for key, value in special.items() if value is not None}
        if path.suffix == ".jinja" or (path.is_dir() and (path / TEMPLATE_FILE).is_file()):
            return cls((path / TEMPLATE_FILE if path.is_dir() else path).read_text(), special, spec)
        source = config.get("chat_template")
        if isinstance(source, list):  # several named templates: the default one
            source = next((t.get("template") for t in source if isinstance(t, dict) and t.get("name") == "default"),
                          None)
        if not isinstance(source, str):
            raise UserError(f"data.chat_template={spec}: {path} holds no chat template (no {TEMPLATE_FILE}, no "
                            f"chat_template string in {CONFIG_FILE}): give {FORMS}")
        return cls(source, special, spec)

    def render(self, messages: Messages, add_generation_prompt: bool = False) -> str:
        """The text of messages; a jinja2.TemplateError where the template fails on them."""
        return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                    **self.special_tokens)

    def pieces(self, messages: Messages) -> list[tuple[str, bool]]:
        """The rendered conversation cut into (text, is the assistant's) pieces, in order (module docstring): a
        jinja2.TemplateError where the template fails, a ValueError where a prefix does not render as a prefix
        of its continuation or no assistant message has text."""
        pieces, done = [], ""
        for i, message in enumerate(messages):
            if message["role"] != ASSISTANT:
                continue
            prompt, turn = self.render(messages[:i], add_generation_prompt=True), self.render(messages[:i + 1])
            if not (prompt.startswith(done) and turn.startswith(prompt)):
                raise ValueError(f"the template does not render the conversation up to message {i + 1} as a "
                                 "prefix of its continuation, so the assistant's text cannot be told apart")
            pieces += [(prompt[len(done):], False), (turn[len(prompt):], True)]
            done = turn
        whole = self.render(messages)
        if not whole.startswith(done):
            raise ValueError("the template does not render the conversation as a continuation of its turns")
        pieces.append((whole[len(done):], False))
        if not any(text for text, assistant in pieces if assistant):
            raise ValueError("it has no assistant message (with text) to learn")
        return [(text, assistant) for text, assistant in pieces if text]


def find_template(spec: str) -> pathlib.Path:
    """The path data.chat_template names: absolute, else relative to the working directory, else to $LM_DATA_DIR."""
    path = pathlib.Path(spec).expanduser()
    places = [path]
    if not path.is_absolute() and os.environ.get(DATA_DIR_ENV):
        places.append(pathlib.Path(os.environ[DATA_DIR_ENV]) / path)
    found = next((place for place in places if place.exists()), None)
    if found is None:
        raise UserError(f"data.chat_template={spec}: no such built-in or path (looked at "
                        f"{', '.join(map(str, places))}): give {FORMS}")
    return found


def read_config(path: pathlib.Path, spec: str) -> dict:
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"data.chat_template={spec}: {path} cannot be read as JSON ({e})") from None
    if not isinstance(config, dict):
        raise UserError(f"data.chat_template={spec}: {path} is not a JSON object")
    return config


def encode_pieces(tokenizer: BPETokenizer, conversations: Sequence[list[tuple[str, bool]]]
                  ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each conversation's pieces tokenised one by one (in parallel) and joined: (ids (n,) int32, assistant
    (n,) float32: 1 on the tokens of the assistant's pieces, 0 elsewhere)."""
    flat = [piece for pieces in conversations for piece, _ in pieces]
    encoded = iter(tokenizer.encode_batch(flat)) if flat else iter(())
    result = []
    for pieces in conversations:
        ids = [next(encoded) for _ in pieces]
        marks = [np.full(len(piece_ids), float(assistant), np.float32)
                 for piece_ids, (_, assistant) in zip(ids, pieces, strict=True)]
        result.append((np.concatenate(ids).astype(np.int32), np.concatenate(marks)))
    return result
