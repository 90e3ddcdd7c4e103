"""Supervised fine-tuning: a GPT (language_model's) on conversations rendered with a chat template, the loss on
the assistant's tokens only (configs/sft.py).

Each record of data.source (any source of the data layer) is a prompt/response pair (data.prompt_field,
data.response_field) or a conversation (data.messages_field: {role, content} messages). The chat template
(data.chat_template: lm/data/chat.py) renders it and marks the assistant's text; its pieces are tokenised with
data.tokenizer into ids (n,) and the assistant's mark (n,): 1 on the assistant's tokens (its end-of-turn marker
included), 0 on every system, user and template token. Conversations are packed by conversation into rows of
context_length + 1 tokens with segment ids (lm/data/packing.py, the marks travelling with the ids as the rows'
weights), so that no token attends to, or is scored across, another conversation. The training loss is the
mean cross-entropy over the assistant's tokens (data.train_on_prompt=True: over every token); the held-out loss
(eval_cross_entropy, and val_answer_loss over every held-out row after training) is always the assistant's.

Truncation: a conversation longer than a row (context_length + 1 tokens) keeps its last context_length + 1
tokens, its start cut (the prompt's, or earlier turns'), as long as its last assistant response and the token
before it fit whole; otherwise it is dropped. Both are counted and printed; a source left with no conversation
is a UserError. A record without the fields named, a message that is not a {role, content} object of strings,
a template that fails to render a conversation, or one with no assistant message is a bad record: one error
line naming it, or with data.skip_bad_records skipped and counted.
"""

import itertools
import pathlib
import sys
from collections.abc import Callable

import jax
import ml_collections
import numpy as np

from experiments.language_model import TEMPLATE_FILE, TOKENIZER_FILE, LanguageModel, post_training_data
from lm import runs
from lm.data import bpe, chat, packing, run_cache, sources
from lm.errors import UserError

CACHED_OPTIONS = ("source", "val_source", "val_fraction", "max_records", "prompt_field", "response_field",
                  "messages_field", "chat_template", "skip_bad_records")  # what the encoded conversations depend on
Conversation = tuple[np.ndarray, np.ndarray]  # (ids (n,) int32, the assistant's mark (n,) float32)


class SFT(LanguageModel):
    """The language model on packed conversations: train_rows (with the training weights), val_rows (with the
    assistant's marks as weights)."""

    def __init__(self, config: ml_collections.ConfigDict, tokenizer: bpe.BPETokenizer, template: chat.ChatTemplate,
                 train_rows: packing.PackedRows, val_rows: packing.PackedRows,
                 data_cache: run_cache.DataCache | None = None):
        super().__init__(config, tokenizer, data_cache=data_cache, train_rows=[train_rows], chat_template=template)
        self.val_rows = val_rows

    def train_data(self, batch_size: int, seed: int, shard: tuple[int, int], start_step: int):
        return packing.train_batches(self.train_rows[0], batch_size, seed, shard, start_step)

    def eval_weight(self, batch) -> jax.Array:
        """The batch's scored tokens: the eval means are per assistant token."""
        return batch["weights"].sum()

    def eval_data(self):
        e = self.config.eval
        return packing.eval_batches(self.val_rows, e.batch_size, e.num_batches)

    def final_results(self, params, evaluate, workdir: pathlib.Path) -> dict[str, float]:
        """val_answer_loss: the mean cross-entropy per assistant token of every held-out conversation."""
        batches = every_row(packing.examples(self.val_rows), self.config.eval.batch_size)
        return {"val_answer_loss": evaluate(batches)["cross_entropy"]}


def every_row(rows: dict[str, np.ndarray], batch_size: int) -> list[dict[str, np.ndarray]]:
    """Batches of batch_size rows holding every row of rows (arrays (R, ...)) once, in order; the last one filled
    up with rows of zeros (weight 0: they count in no mean)."""
    count = len(next(iter(rows.values())))
    padded = -(-count // batch_size) * batch_size
    filled = {key: np.concatenate([values, np.zeros((padded - count, *values.shape[1:]), values.dtype)])
              for key, values in rows.items()}
    return [{key: values[start:start + batch_size] for key, values in filled.items()}
            for start in range(0, padded, batch_size)]


def fit_to_row(conversation: Conversation, width: int) -> Conversation | None:
    """The conversation as it goes into rows of width tokens (module docstring): whole if it fits; else its last
    width tokens if they hold its last assistant response and the token before it; else None (dropped)."""
    ids, assistant = conversation
    if len(ids) <= width:
        return conversation
    starts = np.flatnonzero(np.diff(assistant, prepend=0) > 0)  # where the assistant's runs of tokens begin
    cut = len(ids) - width
    return (ids[cut:], assistant[cut:]) if cut < starts[-1] else None


def record_fields(data: ml_collections.ConfigDict) -> tuple[sources.Fields, Callable[[tuple], chat.Messages]]:
    """The fields each record gives and the function from their values to the conversation's messages."""
    if data.messages_field:
        return {"data.messages_field": chat.MessagesField(data.messages_field)}, lambda values: values[0]
    fields = {"data.prompt_field": data.prompt_field, "data.response_field": data.response_field}
    return fields, lambda values: chat.pair_messages(*values)


def rendered(source: sources.Source, to_messages: Callable[[tuple], chat.Messages], data: ml_collections.ConfigDict,
             template: chat.ChatTemplate) -> list[list[tuple[str, bool]]]:
    """The pieces (chat.ChatTemplate.pieces) of the conversation (to_messages of a record's values) of each record
    of source (its first data.max_records); a record the template fails on is a UserError naming it, or with
    data.skip_bad_records skipped, counted and printed."""
    conversations, skipped, first = [], 0, None
    records = itertools.islice(source, data.max_records or None)
    for where, values in records:
        try:
            conversations.append(template.pieces(to_messages(values)))
        except Exception as e:  # noqa: BLE001 (a template fails with whatever its expressions raise)
            problem = f"{where}: data.chat_template={template.name} fails on it ({type(e).__name__}: {e})"
            if not data.skip_bad_records:
                raise UserError(f"{source.name}: {problem}; {sources.SKIP_HINT}") from None
            skipped, first = skipped + 1, first or problem
    if first:
        print(f"warning: skipped {skipped} conversations of {source.name} (the first: {first})", file=sys.stderr)
    if not conversations:
        raise UserError(f"{source.name} gives no conversation: check data.source and the fields it names "
                        "(data.prompt_field and data.response_field, or data.messages_field)")
    return conversations


def encoded_conversations(data: ml_collections.ConfigDict, tokenizer: bpe.BPETokenizer, template: chat.ChatTemplate,
                          cache: run_cache.DataCache) -> dict[str, list[Conversation]]:
    """{"train": ..., "val": ...} conversations, tokenised: of data.source, and of data.val_source or else the last
    data.val_fraction of source's. Read, rendered and tokenised, or for a resumed run read from its data cache."""
    key = run_cache.digest({name: data[name] for name in CACHED_OPTIONS}, tokenizer.tokenizer.to_str(),
                           template.source, template.special_tokens)

    def read() -> dict[str, list[Conversation]]:
        fields, to_messages = record_fields(data)
        named = [(data.source, "data.source")] + ([(data.val_source, "data.val_source")] if data.val_source else [])
        opened = [sources.Source(spec, fields, data.skip_bad_records, option) for spec, option in named]
        encoded = [chat.encode_pieces(tokenizer, rendered(source, to_messages, data, template)) for source in opened]
        if data.val_source:
            return {"train": encoded[0], "val": encoded[1]}
        conversations = encoded[0]
        if len(conversations) < 2:
            raise UserError(f"data.source={data.source} gives {len(conversations)} conversation: too few to hold some "
                            "out; give more, or data.val_source")
        cut = len(conversations) - max(1, int(len(conversations) * data.val_fraction))
        return {"train": conversations[:cut], "val": conversations[cut:]}

    return cache.get("conversations", key, read)


def packed(conversations: list[Conversation], data: ml_collections.ConfigDict, option: str,
           train_on_prompt: bool) -> packing.PackedRows:
    """The conversations cut or dropped to fit a row (fit_to_row: the counts printed) and packed by conversation,
    their weights the assistant's marks (or ones: train_on_prompt)."""
    width = data.context_length + 1
    fitted = [fit_to_row(conversation, width) for conversation in conversations]
    kept = [conversation for conversation in fitted if conversation is not None]
    truncated = sum(len(ids) > width for ids, _ in conversations) - (len(fitted) - len(kept))
    if not kept:
        raise UserError(f"{option}: all {len(conversations)} conversations are dropped: their last assistant response "
                        f"does not fit a row of data.context_length + 1 = {width} tokens; raise data.context_length")
    weights = [np.ones_like(assistant) if train_on_prompt else assistant for _, assistant in kept]
    rows = packing.pack_documents([ids for ids, _ in kept], data.context_length, weights=weights)
    print(f"{option}: {len(conversations)} conversations; {truncated} longer than a row of {width} tokens cut from the "
          f"left (their last assistant response kept whole), {len(fitted) - len(kept)} dropped (their last response "
          f"does not fit); packed into {len(rows.tokens)} rows, {packing.padding_fraction(rows):.2%} padding")
    return rows


def build(config: ml_collections.ConfigDict, workdir: pathlib.Path | None = None) -> SFT:
    config, tokenizer = post_training_data(config)  # (the run's config: init_from's tokenizer, its vocabulary)
    d = config.data
    template = chat.ChatTemplate.load(d.chat_template, tokenizer)
    cache = run_cache.DataCache(workdir)
    conversations = encoded_conversations(d, tokenizer, template, cache)
    val_option = "data.val_source" if d.val_source else f"data.source's held-out {d.val_fraction:g}"
    return SFT(config, tokenizer, template, packed(conversations["train"], d, "data.source", d.train_on_prompt),
               packed(conversations["val"], d, val_option, train_on_prompt=False), data_cache=cache)


def from_workdir(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> LanguageModel:
    """The language model of a trained run, for sampling and export: its saved tokenizer and chat template (a
    run folder from before lm kept its template: data.chat_template, loaded again), no data."""
    tokenizer = run_cache.load_saved(workdir / TOKENIZER_FILE, bpe.BPETokenizer.load)
    template = saved_template(workdir) or chat.ChatTemplate.load(config.data.chat_template, tokenizer)
    return LanguageModel(config, tokenizer, chat_template=template)


def saved_template(folder: pathlib.Path) -> chat.ChatTemplate | None:
    """The chat template a post-training run keeps in its folder (TEMPLATE_FILE), or None for a folder without one;
    a damaged file is a UserError."""
    path = folder / TEMPLATE_FILE
    if not path.is_file():
        return None
    remedy = "delete it to load data.chat_template again"
    saved = runs.read_json(path, remedy)
    if not {"source", "special_tokens", "name"} <= saved.keys():
        raise UserError(f"{path} is damaged (it lacks the template's source, special tokens or name): {remedy}")
    return chat.ChatTemplate(saved["source"], saved["special_tokens"], saved["name"])
