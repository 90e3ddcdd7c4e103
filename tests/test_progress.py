"""Progress lines of long passes (lm/progress.py) and the chunked passes that print them: tokenising a
text in pieces (lm prepare) and a corpus in batches of sentences (BERT) gives the ids of one call."""

import jax.numpy as jnp
import numpy as np
import pytest

from lm import progress
from lm.cli import prepare
from lm.data import bpe, masked_lm


class Clock:
    """A clock a test moves by hand."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_runs_eta_leaves_out_its_first_dispatch():
    """The first dispatch of a 2000-step run takes 5 s (buffers, the input pipeline, the first program), the
    steps after it 0.1 s: no ETA from the first alone (it would say 2.8 hours), then 0.1 s for each step left."""
    clock = Clock()
    eta = progress.RunEta(2000, clock=clock)
    clock.now += 5.0
    assert eta.seconds_left(1) is None
    assert eta.seconds_left(1) is None  # no step since
    clock.now += 4.9
    assert eta.seconds_left(50) == pytest.approx(0.1 * 1950)
    clock.now += 5.0 + 5.0  # 50 steps and an evaluation that took as long: it recurs, so it counts
    assert eta.seconds_left(100) == pytest.approx(14.9 / 99 * 1900)


def test_a_line_every_so_often_none_for_a_short_pass_nor_after_the_last_chunk():
    clock, lines = Clock(), []
    bar = progress.Progress("decoding 40 sentences (beam 4)", 4, "sentences", every=10.0, clock=clock,
                            write=lines.append)
    clock.now += 5.0
    bar.advance(10)  # 5 s in: too early for a line
    assert lines == []
    clock.now += 15.0
    bar.advance(10)  # 20 s for 20 sentences: 2 chunks left at 10 s each
    assert lines == ["decoding 40 sentences (beam 4): 2 of 4 | 1.0 sentences/s | ETA 0:00:20"]
    clock.now += 5.0
    bar.advance(10)  # 5 s after the last line
    clock.now += 60.0
    bar.advance(10)  # the last chunk: the pass is over, its caller prints what it gives
    assert len(lines) == 1

    clock, lines = Clock(), []
    bar = progress.Progress("tokenizing", None, "characters", every=10.0, clock=clock, write=lines.append)
    clock.now += 10.0
    bar.advance(25_000)
    assert lines == ["tokenizing: 1 done | 2,500.0 characters/s"]


def test_the_default_interval_is_read_when_a_pass_starts(monkeypatch, capsys):
    monkeypatch.setattr(progress, "PROGRESS_SECONDS", 0.0)
    bar = progress.Progress("eval pass", 3, "batches")
    bar.advance()
    assert capsys.readouterr().out.startswith("eval pass: 1 of 3 | ")


def test_await_each_keeps_the_order_and_counts_each_result_once_ready():
    counted = []

    class Recorder(progress.Progress):
        def advance(self, items: int = 1) -> None:
            counted.append(items)

    drawn = []

    def results():
        for i in range(3):
            drawn.append(i)
            yield {"x": jnp.full((2,), i)}
            assert len(counted) == i  # result i is counted only once result i + 1 is drawn (dispatched)

    done = progress.await_each(results(), Recorder("pass", 3, "rows"), sizes=[5, 6, 7])
    assert [int(r["x"][0]) for r in done] == [0, 1, 2] and counted == [5, 6, 7]
    assert progress.await_each(iter([jnp.zeros(1)] * 2), Recorder("pass", 2, "rows")) and counted[-2:] == [1, 1]
    assert progress.await_each([], Recorder("pass", 0, "rows")) == []


CORPUS = "".join(f"ROMEO {i}: But, soft!\n\n\n  what light through yonder window breaks?\r\n\tCaf\u00e9 "
                 f"\u65e5\u672c  \n<|endoftext|>JULIET: It is the east.   \n\n'tis {i * 7}\n \n" for i in range(40))


@pytest.fixture(scope="module")
def gpt2(data_dir):
    return bpe.BPETokenizer.from_gpt2()


@pytest.mark.parametrize("size", [1, 50, 333])
def test_pieces_of_a_text_tokenize_to_the_ids_of_the_whole(size, gpt2):
    """Cut at every place split_text may cut (size 1) or at a few: the ids of the whole text, with GPT-2's
    tokenizer (its merges join whitespace runs: a cut after a newline would change them)."""
    pieces = bpe.split_text(CORPUS, size)
    assert "".join(pieces) == CORPUS and len(pieces) > 1
    assert all(len(piece) >= size for piece in pieces[:-1])
    whole = gpt2.encode(CORPUS)
    np.testing.assert_array_equal(np.concatenate([gpt2.encode(piece) for piece in pieces]), whole)
    np.testing.assert_array_equal(prepare.tokenize([CORPUS, "x"], gpt2, piece_size=size),
                                  [*whole, gpt2.end_of_text_id, *gpt2.encode("x")])
    assert bpe.split_text("", 10) == [""] and bpe.split_text("a\nb", 10) == ["a\nb"]


def test_a_corpus_tokenized_in_batches_of_sentences_gives_the_ids_of_one_call(data_dir, monkeypatch, capsys):
    from lm.data.wordpiece import WordPieceTokenizer

    tokenizer = WordPieceTokenizer.from_vocab("bert-base-uncased")
    documents = [[f"It is the east. And Juliet is the sun {i}! Arise, fair sun?", "Soft. What light."]
                 for i in range(5)]
    monkeypatch.setattr(progress, "PROGRESS_SECONDS", 0.0)
    in_batches = masked_lm.tokenize_documents(documents, tokenizer, batch_sentences=4)
    assert capsys.readouterr().out.startswith("tokenizing 25 sentences: 1 of 7 | ")
    at_once = masked_lm.tokenize_documents(documents, tokenizer, batch_sentences=1000)
    assert [[s.tolist() for s in d] for d in in_batches] == [[s.tolist() for s in d] for d in at_once]
    assert len(in_batches) == 5 and len(in_batches[0]) == 5
