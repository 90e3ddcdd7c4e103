"""BERT pretraining data: sentence pairs for next-sentence prediction, masked for the masked LM.

Corpus ($LM_DATA_DIR/corpus/<name>.txt.gz, docs/data-files.md): one paragraph a line; documents are
separated by one empty line (gutenberg_books, us_presidential_speeches), or start at a ` = Title = `
line (wikitext2_valid, wikitext2_test; their ` = = Section = = ` lines are left out). A document from a
source (experiments/masked_lm.py) is one record's text, its paragraphs one a line (paragraphs). Paragraphs are
split into sentences (after . ! ? and any closing quotes or brackets), and the sentences of the corpus
are tokenized in encode_batch calls of BATCH_SENTENCES each (in parallel within a call).

Pairs (google-research/bert create_pretraining_data.py, one pass over the documents): sentences of a
document are gathered until they reach a target length of max_seq_len - 3 tokens (with probability
short_seq_prob a random length in [2, max_seq_len - 3], drawn afresh for every pair); A is the first
1..n-1 of them; B is the rest (the true continuation) half of the time, else (and always when only one
sentence was gathered) sentences from a random point of another document, the gathered ones A did not
use going back to be gathered again. The longer of A and B loses a token from its front or back (at
random) until [CLS] A [SEP] B [SEP] fits in max_seq_len.

Masking (per example, fresh every epoch): round(mask_prob * n) of the n non-special tokens (at least
one, at most max_predictions) are chosen; of those 80% become [MASK], 10% a random non-special
token, 10% stay as they are. [CLS], [SEP] and [PAD] are never chosen.

A batch: tokens, segments (B, T) int32, mask (B, T) bool (real tokens), masked_positions,
masked_targets (B, P) int32 and masked_weights (B, P) float32 (0 for the unused prediction slots),
next_sentence (B,) int32 (0: B follows A, 1: B is random), T = max_seq_len, P = max_predictions.

Determinism: the pairs are built once from the seed; global batch s holds the pairs at positions
[s G, (s + 1) G) of an endless stream of seeded shuffles of them (G = batch_size * processes), each
masked with np.random.default_rng([TRAIN_STREAM, seed, position]): it depends on the seed and s only.
"""

import dataclasses
import gzip
import re
from collections.abc import Sequence

import grain
import numpy as np

from lm.data.files import find_file
from lm.data.wordpiece import WordPieceTokenizer
from lm.errors import UserError
from lm.progress import Progress

CORPUS_HOW = "one paragraph a line, documents separated by one empty line, gzip-compressed (docs/data-files.md)"
TITLE_LINE = re.compile(r"^ = [^=].* = $")  # a WikiText article's first line
SECTION_LINE = re.compile(r"^ (= )+.* (= )+$")  # any WikiText heading
SENTENCE_END = re.compile(r"[.!?]+[\"'”’)\]]*\s+")  # the end of a sentence and the spaces after it
BATCH_SENTENCES = 100_000  # sentences tokenized per encode_batch call, with a progress line now and then
TRAIN_STREAM, EVAL_STREAM = 0, 1  # the first entropy word of the masking rngs


Document = list[np.ndarray]  # its sentences' token ids


@dataclasses.dataclass(frozen=True)
class Pair:
    """[CLS] A [SEP] B [SEP] as ids, the length of [CLS] A [SEP] (segment 0), and whether B is random."""

    ids: np.ndarray
    first_length: int
    is_random_next: bool


def read_documents(name: str, max_documents: int = 0) -> list[list[str]]:
    """The documents of $LM_DATA_DIR/corpus/<name>.txt.gz as lists of paragraphs (the first
    max_documents of them; 0: all)."""
    path = find_file(f"corpus/{name}.txt.gz", how=CORPUS_HOW)
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")
    documents: list[list[str]] = [[]]
    wikitext = any(TITLE_LINE.match(line) for line in lines[:10])
    for line in lines:
        if wikitext and TITLE_LINE.match(line) or not wikitext and not line.strip():
            documents.append([])
        elif line.strip() and not (wikitext and SECTION_LINE.match(line)):
            documents[-1].append(line.strip())
    documents = [d for d in documents if d]
    if not documents:
        raise UserError(f"{path} holds no text; replace it with the corpus file ({CORPUS_HOW})")
    return documents[:max_documents] if max_documents else documents


def paragraphs(document: str) -> list[str]:
    """The paragraphs of one document's text, one a line as in a corpus file (read_documents): its non-blank
    lines, stripped."""
    return [line.strip() for line in document.split("\n") if line.strip()]


def split_sentences(paragraph: str) -> list[str]:
    """A paragraph's sentences: cut after . ! ? (and closing quotes or brackets) followed by a space."""
    sentences, start = [], 0
    for end in SENTENCE_END.finditer(paragraph):
        sentences.append(paragraph[start : end.end()].strip())
        start = end.end()
    sentences.append(paragraph[start:].strip())
    return [s for s in sentences if s]


def tokenize_documents(documents: Sequence[Sequence[str]], tokenizer: WordPieceTokenizer,
                       batch_sentences: int = BATCH_SENTENCES) -> list[Document]:
    """Documents of paragraphs -> documents of sentence token ids (int32), in encode_batch calls of
    batch_sentences sentences (progress lines between them); sentences that tokenize to nothing and
    documents left empty are dropped."""
    per_document = [[s for paragraph in d for s in split_sentences(paragraph)] for d in documents]
    every_sentence = [s for document in per_document for s in document]
    starts = range(0, len(every_sentence), batch_sentences)
    progress = Progress(f"tokenizing {len(every_sentence):,} sentences", len(starts), "sentences")
    ids = []
    for start in starts:
        ids += tokenizer.encode_batch(every_sentence[start : start + batch_sentences])
        progress.advance(len(ids) - start)
    tokenized, start = [], 0
    for sentences in per_document:
        document = [np.asarray(i, np.int32) for i in ids[start : start + len(sentences)] if i]
        start += len(sentences)
        if document:
            tokenized.append(document)
    return tokenized


def truncate_pair(a: list[int], b: list[int], max_tokens: int, rng: np.random.Generator) -> None:
    """Shortens the longer of a, b by one token from its front or back (at random) until they fit."""
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        del longer[0 if rng.random() < 0.5 else -1]


def create_pairs(documents: Sequence[Document], max_seq_len: int, short_seq_prob: float,
                 rng: np.random.Generator, cls_id: int, sep_id: int) -> list[Pair]:
    """The pairs of every document in turn (see the module docstring)."""
    max_tokens = max_seq_len - 3  # [CLS] A [SEP] B [SEP]
    pairs = []

    def target_length() -> int:
        return int(rng.integers(2, max_tokens + 1)) if rng.random() < short_seq_prob else max_tokens

    for index, document in enumerate(documents):
        chunk, chunk_length, target, i = [], 0, target_length(), 0
        while i < len(document):
            chunk.append(document[i])
            chunk_length += len(document[i])
            if i == len(document) - 1 or chunk_length >= target:
                a_end = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
                a = [int(t) for sentence in chunk[:a_end] for t in sentence]
                is_random_next = len(chunk) == 1 or rng.random() < 0.5
                if is_random_next and len(documents) > 1:
                    other = int(rng.integers(len(documents) - 1))
                    other += other >= index  # any document but this one
                    b = []
                    for sentence in documents[other][int(rng.integers(len(documents[other]))):]:
                        b.extend(int(t) for t in sentence)
                        if len(b) >= target - len(a):
                            break
                    i -= len(chunk) - a_end  # the unused sentences are gathered again
                else:
                    is_random_next = False
                    b = [int(t) for sentence in chunk[a_end:] for t in sentence]
                truncate_pair(a, b, max_tokens, rng)
                if a and b:
                    ids = np.asarray([cls_id, *a, sep_id, *b, sep_id], np.int32)
                    pairs.append(Pair(ids, len(a) + 2, is_random_next))
                chunk, chunk_length, target = [], 0, target_length()
            i += 1
    return pairs


@dataclasses.dataclass(frozen=True)
class Masking:
    """What mask_pair needs: the token ids it treats specially and the proportions."""

    mask_id: int
    special_ids: np.ndarray  # never chosen
    replacement_ids: np.ndarray  # the random tokens: every id but the specials
    mask_prob: float
    max_predictions: int

    @classmethod
    def of(cls, tokenizer: WordPieceTokenizer, mask_prob: float, max_predictions: int) -> "Masking":
        specials = np.asarray([tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id,
                               tokenizer.mask_id], np.int32)
        replacements = np.setdiff1d(np.arange(tokenizer.vocab_size, dtype=np.int32), specials)
        return cls(tokenizer.mask_id, specials, replacements, mask_prob, max_predictions)


def mask_pair(ids: np.ndarray, masking: Masking, rng: np.random.Generator
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ids (L,) -> (inputs (L,) with the chosen tokens replaced, chosen positions (n,) ascending, their
    original ids (n,)): see the module docstring."""
    candidates = np.flatnonzero(~np.isin(ids, masking.special_ids))
    count = min(masking.max_predictions, max(1, int(round(len(candidates) * masking.mask_prob))), len(candidates))
    positions = np.sort(rng.choice(candidates, count, replace=False))
    roll = rng.random(count)
    inputs = ids.copy()
    inputs[positions[roll < 0.8]] = masking.mask_id
    randomised = positions[roll >= 0.9]
    inputs[randomised] = rng.choice(masking.replacement_ids, len(randomised))
    return inputs, positions, ids[positions]


def make_batch(pairs: Sequence[Pair], rngs: Sequence[np.random.Generator], masking: Masking, max_seq_len: int,
               pad_id: int) -> dict[str, np.ndarray]:
    """Pairs, each with its masking rng -> one batch (see the module docstring for its arrays)."""
    rows, predictions = len(pairs), masking.max_predictions
    batch = {
        "tokens": np.full((rows, max_seq_len), pad_id, np.int32),
        "segments": np.zeros((rows, max_seq_len), np.int32),
        "mask": np.zeros((rows, max_seq_len), bool),
        "masked_positions": np.zeros((rows, predictions), np.int32),
        "masked_targets": np.zeros((rows, predictions), np.int32),
        "masked_weights": np.zeros((rows, predictions), np.float32),
        "next_sentence": np.asarray([p.is_random_next for p in pairs], np.int32),
    }
    for row, (pair, rng) in enumerate(zip(pairs, rngs, strict=True)):
        length = len(pair.ids)
        inputs, positions, targets = mask_pair(pair.ids, masking, rng)
        batch["tokens"][row, :length] = inputs
        batch["segments"][row, pair.first_length : length] = 1
        batch["mask"][row, :length] = True
        batch["masked_positions"][row, : len(positions)] = positions
        batch["masked_targets"][row, : len(positions)] = targets
        batch["masked_weights"][row, : len(positions)] = 1.0
    return batch


class BatchRows:
    """(global step s, the pair indices of global batch s (G,)) -> this process's rows [start, stop),
    example r masked with the rng of stream position s G + r."""

    def __init__(self, pairs: Sequence[Pair], masking: Masking, max_seq_len: int, pad_id: int, seed: int,
                 start: int, stop: int):
        self.pairs, self.masking, self.max_seq_len, self.pad_id = pairs, masking, max_seq_len, pad_id
        self.seed, self.start, self.stop = seed, start, stop

    def __call__(self, step: int, indices: np.ndarray) -> dict[str, np.ndarray]:
        first = step * len(indices)
        rows = range(self.start, self.stop)
        rngs = [np.random.default_rng([TRAIN_STREAM, self.seed, first + r]) for r in rows]
        return make_batch([self.pairs[int(indices[r])] for r in rows], rngs, self.masking, self.max_seq_len,
                          self.pad_id)


def train_batches(pairs: Sequence[Pair], masking: Masking, max_seq_len: int, pad_id: int, batch_size: int,
                  seed: int, shard: tuple[int, int] = (0, 1), start_step: int = 0) -> grain.IterDataset:
    """Endless batches: every pair once per epoch in a fresh seeded order. The k-th is this process's rows
    [index * B, (index + 1) * B) of global batch start_step + k (shard = (index, count), B = batch_size)."""
    index, count = shard
    if len(pairs) < batch_size * count:
        raise UserError(f"{len(pairs)} training pairs are fewer than one batch of {batch_size * count}: use more "
                        "documents (data.corpus, data.max_documents) or a smaller train.batch_size")
    order = grain.MapDataset.range(len(pairs)).shuffle(seed=seed).repeat()
    global_batches = order.batch(batch_size * count, drop_remainder=True)
    rows = BatchRows(pairs, masking, max_seq_len, pad_id, seed, index * batch_size, (index + 1) * batch_size)
    return global_batches.map_with_index(rows)[start_step:].to_iter_dataset()


def eval_batches(pairs: Sequence[Pair], masking: Masking, max_seq_len: int, pad_id: int, batch_size: int,
                 num_batches: int) -> list[dict[str, np.ndarray]]:
    """num_batches fixed batches of the held-out pairs (the first batch_size * num_batches of a seeded
    shuffle), masked once from their own stream."""
    needed = batch_size * num_batches
    if len(pairs) < needed:
        raise UserError(f"the held-out documents give {len(pairs)} pairs, fewer than eval.batch_size x "
                        f"eval.num_batches = {needed}: raise data.eval_documents or lower those")
    chosen = np.random.default_rng([EVAL_STREAM]).permutation(len(pairs))[:needed]
    rngs = [np.random.default_rng([EVAL_STREAM, i]) for i in range(needed)]
    return [make_batch([pairs[int(i)] for i in chosen[b * batch_size : (b + 1) * batch_size]],
                       rngs[b * batch_size : (b + 1) * batch_size], masking, max_seq_len, pad_id)
            for b in range(num_batches)]
