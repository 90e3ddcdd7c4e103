"""Packing by document: the padding best-fit packing leaves on the shared corpus, and how long it takes.

  python benchmarks/packing.py [--context=1024] [--corpus=gutenberg_books,us_presidential_speeches]

Reads the BERT pretraining corpus ($LM_DATA_DIR/corpus/<name>.txt.gz; documents as lm/data/masked_lm.py
read_documents defines them: separated by an empty line, one paragraph a line), encodes each document
(its paragraphs joined by newlines) with GPT-2's tokenizer followed by <|endoftext|>, and packs the
documents into rows of context + 1 tokens (lm/data/packing.py). Prints the documents, tokens, rows, the
padding fraction (goal: under 1% at context 1024) and the seconds tokenizing and packing took.
"""

import time

import numpy as np
from absl import app, flags

from lm.data.bpe import BPETokenizer, split_text
from lm.data.masked_lm import read_documents
from lm.data.packing import pack_documents, padding_fraction

_CONTEXT = flags.DEFINE_integer("context", 1024, "Tokens per training row (inputs); rows hold context + 1.")
_CORPUS = flags.DEFINE_list("corpus", ["gutenberg_books", "us_presidential_speeches"],
                            "Corpus files, $LM_DATA_DIR/corpus/<name>.txt.gz (masked_lm's data.corpus).")
PIECE_CHARACTERS = 100_000  # texts are encoded in pieces of about this size (bpe.split_text: the same ids)


def encode_documents(texts: list[str], tokenizer: BPETokenizer) -> list[np.ndarray]:
    """Each text's (n,) ids followed by <|endoftext|>, encoded in parallel in pieces."""
    pieces = [split_text(text, PIECE_CHARACTERS) for text in texts]
    encodings = iter(tokenizer.tokenizer.encode_batch([p for text in pieces for p in text], add_special_tokens=False))
    end = [tokenizer.end_of_text_id]
    return [np.array([i for _ in text for i in next(encodings).ids] + end, np.int32) for text in pieces]


def main(argv):
    del argv
    texts = ["\n".join(paragraphs) for name in _CORPUS.value for paragraphs in read_documents(name)]
    start = time.perf_counter()
    documents = encode_documents(texts, BPETokenizer.from_gpt2())
    tokenized = time.perf_counter()
    rows = pack_documents(documents, _CONTEXT.value)
    packed = time.perf_counter()
    tokens = sum(map(len, documents))
    longer = sum(len(d) > _CONTEXT.value + 1 for d in documents)
    print(f"corpus {'+'.join(_CORPUS.value)}: {len(documents)} documents ({longer} longer than a row), "
          f"{tokens:,} GPT-2 tokens")
    print(f"context {_CONTEXT.value}: {len(rows.tokens):,} rows of {_CONTEXT.value + 1}, "
          f"padding fraction {padding_fraction(rows):.4%} ({np.count_nonzero(rows.segment_ids == 0):,} slots)")
    print(f"tokenizing {tokenized - start:.1f} s, packing {packed - tokenized:.2f} s")


if __name__ == "__main__":
    app.run(main)
