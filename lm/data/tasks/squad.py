"""SQuAD v1.1: extractive question answering, an answer is a span of the context paragraph.

Files (docs/data-files.md, squad/): train-v1.1-subset-44articles.json.gz (44 of the training set's
articles, 11,877 questions, one answer each: not the full 87,599) and dev-v1.1.json.gz (the official dev
set, 10,570 questions, 1 to 6 reference answers each, all of them used in scoring).

A question and its context become rows [CLS] question [SEP] context window [SEP] as BERT's run_squad
makes them: the question cut to max_query_length pieces; a context longer than the rest of the row is
read in windows that start doc_stride pieces apart (the last one reaching its end), so every context
piece is in at least one window. A window's targets are the first answer's first and last pieces, or
[CLS] (position 0) for both when the answer is not wholly inside it. Every context piece keeps its
character span in the context, which maps a predicted span back to the context's own text.
"""

import dataclasses
import json

import numpy as np

from lm.data.tasks.common import Rows, choose, pad_rows, read_lines
from lm.data.wordpiece import WordPieceTokenizer
from lm.errors import UserError
from lm.task_metrics import best_span

FILES = {"train": "squad/train-v1.1-subset-44articles.json.gz", "dev": "squad/dev-v1.1.json.gz"}


@dataclasses.dataclass(frozen=True)
class Question:
    id: str
    question: str
    context: str
    answers: tuple[str, ...]  # every reference answer
    answer_starts: tuple[int, ...]  # their character offsets in context


def load(split: str, limit: int = 0, seed: int | None = None) -> list[Question]:
    """The questions of a split in file order (`limit` of them, common.choose: the first, or drawn with a seed;
    0: all); an answer that is not the text at its offset in the context is a UserError."""
    path, lines = read_lines(FILES[split])
    questions = []
    for article in json.loads("\n".join(lines))["data"]:
        for paragraph in article["paragraphs"]:
            context = paragraph["context"]
            for qa in paragraph["qas"]:
                answers = tuple(a["text"] for a in qa["answers"])
                starts = tuple(int(a["answer_start"]) for a in qa["answers"])
                for text, start in zip(answers, starts, strict=True):
                    if context[start : start + len(text)] != text:
                        raise UserError(f"{path}: question {qa['id']}: answer {text!r} is not at its answer_start "
                                        f"{start} in the context; fix or remove that answer")
                if not answers:
                    raise UserError(f"{path}: question {qa['id']} has no answer (SQuAD v1.1 questions all have "
                                    "one); remove it")
                questions.append(Question(qa["id"], qa["question"], context, answers, starts))
                if seed is None and len(questions) == limit:
                    return questions
    return choose(questions, limit, seed)


@dataclasses.dataclass
class Windows:
    """The rows of a list of questions (several per question for a long context) and what maps them back."""

    rows: Rows  # tokens, segments, mask; span_mask (N, T) int32: 1 at [CLS] and the window's context
    #             pieces (where the span head may point); start, end (N,) int32: the answer's pieces
    question: np.ndarray  # (N,) int32: the question (its index in the list) each row reads
    offsets: np.ndarray  # (N, T, 2) int32: each context piece's character span [start, end) in the
    #                      context; -1 elsewhere


def window_starts(num_pieces: int, window: int, doc_stride: int) -> list[int]:
    """Where run_squad's windows of at most `window` pieces start: 0, then doc_stride on, until one
    reaches the end."""
    starts = [0]
    while starts[-1] + window < num_pieces:
        starts.append(starts[-1] + min(window, doc_stride))
    return starts


def answer_pieces(offsets: np.ndarray, start: int, text: str) -> tuple[int, int]:
    """The first and last context pieces (inclusive) that overlap the answer's characters [start,
    start + len(text)); offsets (P, 2)."""
    first = int(np.searchsorted(offsets[:, 1], start, side="right"))  # first piece ending after start
    last = int(np.searchsorted(offsets[:, 0], start + len(text), side="left")) - 1  # last one starting before end
    return first, max(first, last)


def encode(tokenizer: WordPieceTokenizer, questions: list[Question], length: int, doc_stride: int,
           max_query_length: int) -> Windows:
    """The rows of every window of every question (see the module docstring)."""
    contexts = {}  # context -> (ids, offsets (P, 2)): questions share paragraphs
    sequences, span_masks, targets, owners, row_offsets = [], [], [], [], []
    for index, q in enumerate(questions):
        if q.context not in contexts:
            ids, offsets = tokenizer.encode_with_offsets(q.context)
            contexts[q.context] = ids, np.asarray(offsets, np.int32).reshape(-1, 2)
        context_ids, context_offsets = contexts[q.context]
        query = tokenizer.encode(q.question)[:max_query_length]
        window = length - len(query) - 3
        if window < 1:
            raise UserError(f"data.max_seq_len={length} leaves no room for the context after a question of "
                            f"{len(query)} pieces: raise it or lower data.max_query_length")
        first, last = answer_pieces(context_offsets, q.answer_starts[0], q.answers[0])
        for start in window_starts(len(context_ids), window, doc_stride):
            stop = min(start + window, len(context_ids))
            ids, segments = tokenizer.encode_pair(query, context_ids[start:stop])
            shift = len(query) + 2 - start  # a context piece's position in the row, less its index
            span_mask = np.zeros(length, np.int32)
            span_mask[[0, *range(start + shift, stop + shift)]] = 1
            offsets = np.full((length, 2), -1, np.int32)
            offsets[start + shift : stop + shift] = context_offsets[start:stop]
            inside = start <= first and last < stop
            sequences.append((ids, segments))
            span_masks.append(span_mask)
            targets.append((first + shift, last + shift) if inside else (0, 0))
            owners.append(index)
            row_offsets.append(offsets)
    rows = pad_rows(sequences, length, tokenizer.pad_id)
    targets = np.asarray(targets, np.int32).reshape(-1, 2)
    rows.update(span_mask=np.stack(span_masks), start=targets[:, 0], end=targets[:, 1])
    return Windows(rows, np.asarray(owners, np.int32), np.stack(row_offsets))


def predicted_answers(start_logits: np.ndarray, end_logits: np.ndarray, windows: Windows,
                      questions: list[Question], max_answer_length: int, n_best: int) -> dict[str, str]:
    """Start and end logits of every window (N, T) -> {question id: answer text}: the best valid span
    over each question's windows (lm.task_metrics.best_span over its context pieces), cut from the
    context by the pieces' character spans. A question no window has a valid span for is left out:
    unanswered, it scores 0 (lm.task_metrics.squad_scores)."""
    answers = {}
    for index, q in enumerate(questions):
        rows = np.flatnonzero(windows.question == index)
        offsets = windows.offsets[rows]  # (W, T, 2)
        window, start, end = best_span(start_logits[rows], end_logits[rows], offsets[..., 0] >= 0,
                                       max_answer_length, n_best)
        if window >= 0:
            answers[q.id] = q.context[offsets[window, start, 0] : offsets[window, end, 1]]
    return answers
