"""Synthetic passkey retrieval (`lm eval --tasks=passkey:LENGTH`): can the model fetch a number hidden in filler
LENGTH tokens long, as Landmark Attention and Position Interpolation measure context extension.

Each document is the filler ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back
again.", sentence by sentence, repeated) with "The pass key is NNNNN. Remember it. NNNNN is the pass key." inserted
between two sentences at a depth, then "What is the pass key? The pass key is"; the continuation is " NNNNN". The
filler is as long as it can be while the whole text (prompt and key) is at most LENGTH tokens of the model's
tokenizer (characters for a character-level run). Document i of N has depth i / (N - 1) (0: the key first, 1: the
key last) and a five-digit key drawn from a generator seeded by (seed, i): the documents depend on the tokenizer,
LENGTH, N and the seed alone.

A document is retrieved when the key is the model's greedy continuation of the prompt: each of its tokens the
argmax after the prompt and the key's tokens before it (is_greedy of lm/eval/scoring.py, which holds exactly when
greedy decoding writes those tokens). acc is the share retrieved; acc_depth_A_B the share among documents of depth in
[A%, B%) (the last band includes 100%; None where no document falls in it).
"""

import dataclasses

import numpy as np

from lm.errors import UserError
from lm.task_metrics import mean_stderr

FILLER = ("The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again.")
KEY_LINE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key? The pass key is"
DEFAULT_DOCUMENTS = 100  # without --limit
DEPTH_BANDS = ((0, 25), (25, 50), (50, 75), (75, 100))  # in percent of the filler
METRICS = ("acc", *(f"acc_depth_{a}_{b}" for a, b in DEPTH_BANDS))
PREFIX = "passkey:"


@dataclasses.dataclass(frozen=True)
class Passkey:
    """A document: the prompt, the key (five digits) and the depth (0 to 1) its line was put at."""

    prompt: str
    key: str
    depth: float

    @property
    def request(self) -> tuple[str, str]:
        """(context, continuation) as the scorer takes it: the prompt, then " NNNNN"."""
        return self.prompt, " " + self.key


def parse_length(name: str) -> int:
    """'passkey:512' -> 512; a missing or non-positive LENGTH is a UserError."""
    length = name[len(PREFIX):]
    if not length.isdigit() or int(length) < 1:
        raise UserError(f"--tasks: {name!r}: write passkey:LENGTH, LENGTH a positive count of tokens "
                        "(e.g. passkey:512)")
    return int(length)


def text(sentences: int, depth: float, key: str) -> str:
    """The prompt of `sentences` filler sentences with the key's line at depth (between sentences)."""
    filler = [FILLER[i % len(FILLER)] for i in range(sentences)]
    at = round(depth * sentences)
    return " ".join([*filler[:at], KEY_LINE.format(key=key), *filler[at:], QUESTION])


def document(encode, length: int, depth: float, key: str) -> Passkey:
    """The document with the most filler sentences whose prompt and key take at most length tokens; a length too
    short for the key's line and the question alone is a UserError."""

    def tokens(sentences: int) -> int:
        prompt = text(sentences, depth, key)
        return len(encode(prompt + " " + key))

    if tokens(0) > length:
        raise UserError(f"the key's line and the question alone take {tokens(0)} tokens, over {length}: give a "
                        "longer LENGTH")
    low, high = 0, 1  # tokens(low) <= length; grow high until it is over
    while tokens(high) <= length:
        low, high = high, high * 2
    while high - low > 1:  # the largest count that fits (tokens grow with the sentences)
        middle = (low + high) // 2
        low, high = (middle, high) if tokens(middle) <= length else (low, middle)
    return Passkey(text(low, depth, key), key, depth)


def documents(encode, length: int, count: int | None = None, seed: int = 0) -> list[Passkey]:
    """count documents (default DEFAULT_DOCUMENTS) of at most length tokens of encode (text -> ids), depths spread
    evenly from 0 to 1, keys seeded by (seed, i)."""
    check_digits(encode)
    count = DEFAULT_DOCUMENTS if count is None else count
    found = []
    for i in range(count):
        key = str(np.random.default_rng([seed, i]).integers(10_000, 100_000))
        found.append(document(encode, length, i / max(count - 1, 1), key))
    return found


def check_digits(encode) -> None:
    """A character-level encoder (lm/eval/models.py's CharacterEncoder, whose .ids are its characters) that lacks a
    digit cannot write the keys (it would drop them): a UserError."""
    ids = getattr(encode, "ids", None)
    missing = "".join(digit for digit in "0123456789" if ids is not None and digit not in ids)
    if missing:
        raise UserError(f"the run's characters lack the digits {missing}: it cannot write a pass key; score a run "
                        "whose text has every digit (or a BPE run)")


def check_length(length: int, max_length: int) -> None:
    """A LENGTH the model cannot read (over its context) is a UserError."""
    if length > max_length:
        raise UserError(f"{length} tokens: the model reads {max_length} (its data.context_length); give a LENGTH "
                        f"up to {max_length}, or extend the model's context first (docs/long-context.md)")


def aggregate(documents_: list[Passkey], responses: list) -> dict[str, float | None]:
    """acc, and acc per depth band, from each document's [(log-likelihood, is_greedy)] (standard errors:
    '<metric>_stderr', the harness's, as lm/eval/tasks.py's)."""
    retrieved = [float(response[0][1]) for response in responses]
    results: dict[str, float | None] = {"acc": float(np.mean(retrieved)), "acc_stderr": mean_stderr(retrieved)}
    for (a, b), metric in zip(DEPTH_BANDS, METRICS[1:], strict=True):
        inside = [r for r, d in zip(retrieved, documents_, strict=True)
                  if a <= 100 * d.depth < b or (b == 100 and d.depth == 1)]
        results.update({metric: float(np.mean(inside)) if inside else None,
                        f"{metric}_stderr": mean_stderr(inside)})
    return results
