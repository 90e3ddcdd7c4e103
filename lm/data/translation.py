"""Multi30k translation data: sentence pairs, tokenizers and length-bucketed Grain pipelines.

Conventions (every tokenizer here shares them):
- ids: pad 0, unk 1, bos 2, eos 3; ordinary tokens from 4 up.
- source ids = tokens + [eos];  target ids = [bos] + tokens + [eos].
- A batch (B rows, all of one bucket length L) is a dict of int32 arrays:
    source          (B, L)  source ids, then pad
    source_mask     (B, L)  1 where source != pad (the encoder's keys, the cross-attention keys)
    decoder_inputs  (B, L)  target[:-1] = [bos] + tokens, then pad (teacher forcing)
    targets         (B, L)  target[1:]  = tokens + [eos], then pad (the labels)
    target_mask     (B, L)  1 where targets != pad; the same positions are real in decoder_inputs.
                            Loss = sum(ce * target_mask) / sum(target_mask).
    index           (B,)    the example's position in its split; -1 for a dummy row
    valid           (B,)    1 for a real example, 0 for a dummy row
  Dummy rows (only in the last, partial batch of a training epoch and of an eval split) are all pad with
  zero masks, so they add nothing to a masked loss or to token counts; attention must use a finite
  "minus large" value for masked logits (jax.nn.dot_product_attention does), not -inf, because a dummy
  row has every key masked.
- Bucket lengths: an example needs L >= max(len(source ids), len(target ids) - 1) and goes to the
  smallest bucket that fits, so the jitted step sees at most len(buckets) shapes per batch size.
"""

import collections
import dataclasses
import gzip
import io
import json
import pathlib
import re
from collections.abc import Sequence
from typing import Protocol

import grain
import numpy as np
import sentencepiece as spm

from lm.data.files import find_file
from lm.errors import UserError

# ---------------------------------------------------------------------------------------------
# Sentence pairs
# ---------------------------------------------------------------------------------------------

SPLITS = ("train", "val", "test_2016_flickr")
LANGUAGES = ("de", "en")
MULTI30K_DIR = "multi30k"
MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{split}.{lang}.gz"


def read_lines(path: pathlib.Path) -> list[str]:
    """The lines of a gzipped UTF-8 file, split on '\\n' only (no other Unicode line breaks); a file
    that is not gzipped UTF-8 text, or holds no lines, is a UserError naming it."""
    try:
        with gzip.open(path, "rt", encoding="utf-8", newline="") as f:
            lines = f.read().split("\n")
    except (OSError, EOFError, UnicodeDecodeError) as e:  # gzip.BadGzipFile is an OSError
        raise UserError(f"{path} cannot be read as gzipped UTF-8 text ({type(e).__name__}: {e}); replace it "
                        "with the Multi30k file (see docs/data-files.md)") from e
    if lines and lines[-1] == "":
        lines.pop()  # the file's final newline
    if not lines:
        raise UserError(f"{path} is empty; replace it with the Multi30k file (see docs/data-files.md)")
    return lines


def load_pairs(split: str, source_lang: str = "de", target_lang: str = "en") -> tuple[list[str], list[str]]:
    """(sources, targets) of a Multi30k split, line-aligned, with only the newline removed.

    Files come from $LM_DATA_DIR/multi30k/<split>.<lang>.gz, else a download (files.find_file)."""
    if split not in SPLITS:
        raise UserError(f"unknown Multi30k split {split!r}: use one of {list(SPLITS)}")
    for lang in (source_lang, target_lang):
        if lang not in LANGUAGES:
            raise UserError(f"unknown Multi30k language {lang!r}: use one of {list(LANGUAGES)}")
    if source_lang == target_lang:
        raise UserError(f"source and target language are both {source_lang!r}")
    paths = [
        find_file(f"{MULTI30K_DIR}/{split}.{lang}.gz", MULTI30K_URL.format(split=split, lang=lang))
        for lang in (source_lang, target_lang)
    ]
    sources, targets = (read_lines(path) for path in paths)
    if len(sources) != len(targets):
        raise UserError(
            f"Multi30k {split} is not line-aligned: {paths[0]} has {len(sources)} lines, "
            f"{paths[1]} has {len(targets)}"
        )
    return sources, targets


# ---------------------------------------------------------------------------------------------
# Tokenizers
# ---------------------------------------------------------------------------------------------

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
SPECIAL_TOKENS = ("<pad>", "<unk>", "<bos>", "<eos>")  # WordTokenizer's pieces for ids 0..3
SENTENCEPIECE_FILE = "sentencepiece.model"
WORD_VOCAB_FILE = "word_vocab.json"
TOKENIZERS_DIR = "tokenizers"  # workdir/tokenizers/{source,target}/

# Lowercased word tokenisation, close to spaCy's for Multi30k: words, numbers with inner . or ,
# English clitics ("n't", "'s", "'re", ...), every other non-space character alone, and "<unk>" kept
# whole (so decoded word-level output re-tokenises to the same tokens).
WORD_PATTERN = re.compile(r"<unk>|\d+(?:[.,]\d+)+|\w+(?=n't\b)|n't\b|'(?:s|re|ve|ll|d|m)\b|\w+|[^\w\s]")


def word_tokenize(text: str, lowercase: bool = True) -> list[str]:
    """'A man's T-shirt.' -> ['a', 'man', "'s", 't', '-', 'shirt', '.'] (lowercased by default)."""
    return WORD_PATTERN.findall(text.lower() if lowercase else text)


class Tokenizer(Protocol):
    pad_id: int
    unk_id: int
    bos_id: int
    eos_id: int

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]:
        """Token ids of text, without bos/eos."""

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ids up to the first eos; pad and bos are skipped."""

    def id_pieces(self, ids: Sequence[int]) -> list[str]:
        """The piece (or word) of every id, specials included ('<eos>', ...), for inspection."""

    def save(self, directory: pathlib.Path) -> None: ...


def _strip_specials(ids: Sequence[int]) -> list[int]:
    """ids up to (not including) the first eos, without pad and bos."""
    out = []
    for i in ids:
        i = int(i)
        if i == EOS_ID:
            break
        if i not in (PAD_ID, BOS_ID):
            out.append(i)
    return out


class SentencePieceTokenizer:
    """A SentencePiece model (unigram or BPE) with pad 0, unk 1, bos 2, eos 3.

    Normalisation is SentencePiece's default nmt_nfkc with extra whitespace removed, so
    decode(encode(s)) == s except that NFKC-changed characters are normalised and runs of spaces
    (and leading/trailing spaces) collapse; 84 of the 29000 German training sentences have such
    spaces, none in val or test."""

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    def __init__(self, model_proto: bytes):
        self.model_proto = model_proto
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        ids = (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id())
        if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise ValueError(f"SentencePiece model has pad/unk/bos/eos ids {ids}, expected 0/1/2/3")

    @classmethod
    def train(
        cls,
        sentences: Sequence[str],
        vocab_size: int,
        model_type: str = "unigram",
        character_coverage: float = 1.0,
    ) -> "SentencePieceTokenizer":
        """Trains in memory (sentence_iterator in, model_writer out: no files, no network).
        One thread and the whole input (no sampling) make it deterministic. vocab_size is a soft
        limit (hard_vocab_limit=False): a small corpus may give fewer pieces; see .vocab_size."""
        if model_type not in ("unigram", "bpe"):
            raise UserError(f"SentencePiece model_type={model_type!r}: use 'unigram' or 'bpe'")
        model = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=model,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            hard_vocab_limit=False,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            pad_piece="<pad>",
            unk_piece="<unk>",
            bos_piece="<bos>",
            eos_piece="<eos>",
            num_threads=1,
            input_sentence_size=0,
            minloglevel=2,
        )
        return cls(model.getvalue())

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        """Piece ids of text (n,), without bos/eos."""
        return self._sp.encode(text, out_type=int)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """encode of each text, in one call."""
        return self._sp.encode(list(texts), out_type=int)

    def pieces(self, text: str) -> list[str]:
        """The pieces of text as strings ('▁A', '▁dog', ...), for inspection."""
        return self._sp.encode(text, out_type=str)

    def decode(self, ids: Sequence[int]) -> str:
        """Detokenised text of ids up to the first eos (pad and bos skipped)."""
        return self._sp.decode(_strip_specials(ids))

    def id_pieces(self, ids: Sequence[int]) -> list[str]:
        """The piece of every id, specials included: [5, 3] -> ['▁A', '<eos>']."""
        return [self._sp.id_to_piece(int(i)) for i in ids]

    def save(self, directory: pathlib.Path) -> None:
        """Writes directory/sentencepiece.model (the serialised model, all load needs)."""
        directory = pathlib.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / SENTENCEPIECE_FILE).write_bytes(self.model_proto)

    @classmethod
    def load(cls, directory: pathlib.Path) -> "SentencePieceTokenizer":
        return cls((pathlib.Path(directory) / SENTENCEPIECE_FILE).read_bytes())


class WordTokenizer:
    """Lowercased word-level vocabulary (word_tokenize), for comparison with the PyTorch seq2seq
    tutorials (spaCy tokens, lowercased, min_freq 2). Ids 0..3 are <pad> <unk> <bos> <eos>; then
    words by descending frequency, ties alphabetical. decode joins tokens with single spaces."""

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    def __init__(self, tokens: Sequence[str], lowercase: bool = True):
        if tuple(tokens[: len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
            raise ValueError(f"a word vocabulary starts with {SPECIAL_TOKENS}")
        self.tokens = list(tokens)
        self.lowercase = lowercase
        self._ids = {t: i for i, t in enumerate(self.tokens)}

    @classmethod
    def fit(cls, sentences: Sequence[str], min_freq: int = 2, lowercase: bool = True) -> "WordTokenizer":
        """Vocabulary of the words that occur at least min_freq times in sentences."""
        counts = collections.Counter(t for s in sentences for t in word_tokenize(s, lowercase))
        words = sorted((w for w, c in counts.items() if c >= min_freq and w not in SPECIAL_TOKENS),
                       key=lambda w: (-counts[w], w))
        return cls(list(SPECIAL_TOKENS) + words, lowercase)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        """Word ids of text (n,), unknown words as unk, without bos/eos."""
        return [self._ids.get(t, UNK_ID) for t in word_tokenize(text, self.lowercase)]

    def decode(self, ids: Sequence[int]) -> str:
        """Space-joined words of ids up to the first eos (pad and bos skipped)."""
        return " ".join(self.tokens[i] for i in _strip_specials(ids))

    def id_pieces(self, ids: Sequence[int]) -> list[str]:
        """The word of every id, specials included: [5, 3] -> ['a', '<eos>']."""
        return [self.tokens[int(i)] for i in ids]

    def save(self, directory: pathlib.Path) -> None:
        """Writes directory/word_vocab.json (the token list and the lowercase flag)."""
        directory = pathlib.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        data = {"lowercase": self.lowercase, "tokens": self.tokens}
        (directory / WORD_VOCAB_FILE).write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, directory: pathlib.Path) -> "WordTokenizer":
        data = json.loads((pathlib.Path(directory) / WORD_VOCAB_FILE).read_text(encoding="utf-8"))
        return cls(data["tokens"], data["lowercase"])


def load_tokenizer(directory: pathlib.Path) -> Tokenizer:
    """Whichever tokenizer was saved in directory."""
    directory = pathlib.Path(directory)
    if (directory / SENTENCEPIECE_FILE).is_file():
        return SentencePieceTokenizer.load(directory)
    if (directory / WORD_VOCAB_FILE).is_file():
        return WordTokenizer.load(directory)
    raise UserError(f"no tokenizer in {directory} (expected {SENTENCEPIECE_FILE} or {WORD_VOCAB_FILE})")


def build_tokenizers(
    kind: str,
    train_sources: Sequence[str],
    train_targets: Sequence[str],
    vocab_size: int = 8000,
    model_type: str = "unigram",
    joint: bool = False,
    min_freq: int = 2,
) -> tuple[Tokenizer, Tokenizer]:
    """(source, target) tokenizers fitted on the training sentences.

    kind "sentencepiece": per-language models by default (each side's vocab_size pieces, separate
    embeddings, no German pieces wasted in the English softmax); joint=True trains one model on both
    sides (vocab_size in all) and returns it twice, which allows tied source/target embeddings.
    kind "word": WordTokenizer per language with min_freq (vocab_size and model_type unused)."""
    if kind == "sentencepiece":
        if joint:
            tokenizer = SentencePieceTokenizer.train(list(train_sources) + list(train_targets), vocab_size, model_type)
            return tokenizer, tokenizer
        return (SentencePieceTokenizer.train(train_sources, vocab_size, model_type),
                SentencePieceTokenizer.train(train_targets, vocab_size, model_type))
    if kind == "word":
        if joint:
            tokenizer = WordTokenizer.fit(list(train_sources) + list(train_targets), min_freq)
            return tokenizer, tokenizer
        return WordTokenizer.fit(train_sources, min_freq), WordTokenizer.fit(train_targets, min_freq)
    raise UserError(f"tokenizer kind {kind!r}: use 'sentencepiece' or 'word'")


def save_tokenizers(workdir: pathlib.Path, source: Tokenizer, target: Tokenizer) -> None:
    """Writes workdir/tokenizers/{source,target}/ so translating later needs no data."""
    source.save(pathlib.Path(workdir) / TOKENIZERS_DIR / "source")
    target.save(pathlib.Path(workdir) / TOKENIZERS_DIR / "target")


def load_tokenizers(workdir: pathlib.Path) -> tuple[Tokenizer, Tokenizer]:
    """The (source, target) tokenizers save_tokenizers wrote."""
    root = pathlib.Path(workdir) / TOKENIZERS_DIR
    return load_tokenizer(root / "source"), load_tokenizer(root / "target")


def encode_pairs(
    sources: Sequence[str], targets: Sequence[str], source_tokenizer: Tokenizer, target_tokenizer: Tokenizer
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Source ids (n_s + 1,) = tokens + [eos]; target ids (n_t + 2,) = [bos] + tokens + [eos]; int32."""
    source_ids = [np.array([*source_tokenizer.encode(s), EOS_ID], np.int32) for s in sources]
    target_ids = [np.array([BOS_ID, *target_tokenizer.encode(t), EOS_ID], np.int32) for t in targets]
    return source_ids, target_ids


# ---------------------------------------------------------------------------------------------
# Length-bucketed batches
# ---------------------------------------------------------------------------------------------

DEFAULT_BUCKETS = (16, 24, 32, 48, 64)
Batch = dict[str, np.ndarray]


def needed_lengths(source_ids: Sequence[np.ndarray], target_ids: Sequence[np.ndarray]) -> np.ndarray:
    """(N,) padded length each pair needs: max(len(source ids), len(target ids) - 1)."""
    return np.array([max(len(s), len(t) - 1) for s, t in zip(source_ids, target_ids, strict=True)], np.int64)


def bucket_of(lengths: np.ndarray, buckets: Sequence[int]) -> np.ndarray:
    """(N,) index of the smallest bucket >= each length; len(buckets) where none fits."""
    return np.searchsorted(np.asarray(buckets), lengths, side="left")


def make_batch(
    source_ids: Sequence[np.ndarray], target_ids: Sequence[np.ndarray], rows: np.ndarray, length: int
) -> Batch:
    """One padded batch of the examples rows (B,) (-1: a dummy all-pad row) at bucket length L.
    Pairs longer than L are truncated, keeping eos at the end of both sides."""
    batch_size = len(rows)
    source = np.zeros((batch_size, length), np.int32)  # (B, L)
    decoder_inputs = np.zeros((batch_size, length), np.int32)  # (B, L)
    targets = np.zeros((batch_size, length), np.int32)  # (B, L)
    for b, row in enumerate(rows):
        if row < 0:
            continue
        s, t = source_ids[row], target_ids[row]
        if len(s) > length:
            s = np.append(s[: length - 1], EOS_ID)
        if len(t) - 1 > length:
            t = np.append(t[:length], EOS_ID)
        source[b, : len(s)] = s
        decoder_inputs[b, : len(t) - 1] = t[:-1]
        targets[b, : len(t) - 1] = t[1:]
    return {
        "source": source,
        "source_mask": (source != PAD_ID).astype(np.int32),
        "decoder_inputs": decoder_inputs,
        "targets": targets,
        "target_mask": (targets != PAD_ID).astype(np.int32),
        "index": np.asarray(rows, np.int32),  # (B,)
        "valid": (np.asarray(rows) >= 0).astype(np.int32),  # (B,)
    }


@dataclasses.dataclass(frozen=True)
class EpochPlan:
    """One epoch of global batches: rows (num_batches, G) example indices (-1 = dummy), lengths (num_batches,)."""

    rows: np.ndarray
    lengths: np.ndarray


class BucketedBatches:
    """Random access to an endless, seeded sequence of global batches, epoch by epoch.

    Per epoch e (rng seeded by (seed, e)): walk the buckets from short to long; each bucket's
    examples, permuted, follow the < G examples left over from the shorter buckets, and are cut into
    global batches of G rows; what is left over moves on to the next bucket. The final remainder is
    one partial batch padded with dummy rows. So every kept example appears exactly once per epoch,
    in ceil(N / G) batches, each padded to the smallest bucket that fits its longest row; then the
    batch order is permuted. Every process builds the same plan and takes rows
    [index * B, (index + 1) * B) of each global batch (G = B * count), so all processes agree on the
    bucket length of every step."""

    def __init__(self, source_ids, target_ids, batch_size: int, seed: int, shard: tuple[int, int] = (0, 1),
                 buckets: Sequence[int] = DEFAULT_BUCKETS):
        index, count = shard
        if not 0 <= index < count:
            raise ValueError(f"shard index {index} is not in [0, {count})")
        if list(buckets) != sorted(set(buckets)) or buckets[0] < 2:
            raise ValueError(f"buckets {buckets} must be increasing lengths >= 2")
        self.source_ids, self.target_ids = source_ids, target_ids
        self.batch_size, self.global_batch_size = batch_size, batch_size * count
        self.seed, self.shard, self.buckets = seed, shard, tuple(buckets)
        lengths = needed_lengths(source_ids, target_ids)
        bucket = bucket_of(lengths, self.buckets)
        self.num_dropped = int((bucket == len(self.buckets)).sum())
        if self.num_dropped:
            print(f"translation data: dropped {self.num_dropped} of {len(lengths)} training pairs longer than "
                  f"{self.buckets[-1]} tokens")
        self.lengths = lengths
        self.members = [np.flatnonzero(bucket == k) for k in range(len(self.buckets))]  # kept examples per bucket
        self.num_examples = sum(len(m) for m in self.members)
        if self.num_examples == 0:
            raise UserError("no training pairs fit the largest bucket")
        self.num_batches = -(-self.num_examples // self.global_batch_size)  # per epoch
        self._plans: dict[int, EpochPlan] = {}

    def __len__(self) -> int:
        return self.num_batches

    def plan(self, epoch: int) -> EpochPlan:
        """The global batches of one epoch (the latest two are cached)."""
        if epoch not in self._plans:
            self._plans = {e: p for e, p in self._plans.items() if e == epoch - 1}
            self._plans[epoch] = self._make_plan(epoch)
        return self._plans[epoch]

    def _make_plan(self, epoch: int) -> EpochPlan:
        rng = np.random.default_rng([self.seed, epoch])
        g = self.global_batch_size
        batches, carry = [], np.zeros(0, np.int64)
        for members in self.members:
            pool = np.concatenate([carry, rng.permutation(members)])
            full = len(pool) // g * g
            batches.extend(pool[:full].reshape(-1, g))
            carry = pool[full:]
        if len(carry):
            batches.append(np.concatenate([carry, np.full(g - len(carry), -1)]))
        rows = np.stack(batches)[rng.permutation(len(batches))]  # (num_batches, G)
        longest = np.where(rows >= 0, self.lengths[np.maximum(rows, 0)], 0).max(axis=1)
        lengths = np.asarray(self.buckets)[bucket_of(longest, self.buckets)]  # (num_batches,)
        return EpochPlan(rows, lengths)

    def __getitem__(self, step: int) -> Batch:
        """This process's part (B rows) of global batch number step (counting across epochs)."""
        epoch, position = divmod(step, self.num_batches)
        plan = self.plan(epoch)
        index, _ = self.shard
        rows = plan.rows[position, index * self.batch_size : (index + 1) * self.batch_size]
        return make_batch(self.source_ids, self.target_ids, rows, int(plan.lengths[position]))


def train_batches(
    source_ids: Sequence[np.ndarray],
    target_ids: Sequence[np.ndarray],
    batch_size: int,
    seed: int,
    shard: tuple[int, int] = (0, 1),
    buckets: Sequence[int] = DEFAULT_BUCKETS,
    start_step: int = 0,
) -> grain.IterDataset:
    """Endless, deterministic training batches of batch_size rows per process (shapes
    (batch_size, L), L in buckets), from batch number start_step on; see BucketedBatches for the
    order. Pairs that need more than buckets[-1] tokens are dropped (the count is printed)."""
    batches = BucketedBatches(source_ids, target_ids, batch_size, seed, shard, buckets)
    ds = grain.MapDataset.range(len(batches)).repeat().map_with_index(lambda step, _: batches[step])[start_step:]
    # Batches are built from memory in about a millisecond: no reader threads (Grain's advice for in-memory data).
    return ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))


def eval_batches(
    source_ids: Sequence[np.ndarray],
    target_ids: Sequence[np.ndarray],
    batch_size: int,
    buckets: Sequence[int] = DEFAULT_BUCKETS,
) -> list[Batch]:
    """A split in its original order, as ceil(N / batch_size) fixed global batches: batch i holds
    examples [i * batch_size, (i + 1) * batch_size), padded to the smallest bucket that fits its
    longest pair; the last is filled with dummy rows (index -1, valid 0). Pairs longer than
    buckets[-1] are truncated (the count is printed), so every sentence gets a translation."""
    lengths = needed_lengths(source_ids, target_ids)
    too_long = int((lengths > buckets[-1]).sum())
    if too_long:
        print(f"translation data: truncated {too_long} of {len(lengths)} eval pairs to {buckets[-1]} tokens")
    out = []
    for start in range(0, len(lengths), batch_size):
        rows = np.arange(start, start + batch_size)
        rows[rows >= len(lengths)] = -1
        length = buckets[min(int(bucket_of(lengths[start : start + batch_size].max(), buckets)), len(buckets) - 1)]
        out.append(make_batch(source_ids, target_ids, rows, length))
    return out
