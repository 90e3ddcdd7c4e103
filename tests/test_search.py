"""Greedy and beam search: toy Markov models against brute force, and both model families against teacher forcing."""

import functools
import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm.decode.search import beam_search, gnmt_penalty, greedy_search, rnn_step_fn, tile_beams, transformer_step_fn
from lm.layers.transformer import TransformerConfig
from lm.models.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from lm.models.seq2seq import Seq2Seq, Seq2SeqConfig

BOS, EOS = 2, 3

# ---------------------------------------------------------------------------------------------
# Toy: a per-row second-order Markov model. log p(y_t | y_{t-2}, y_{t-1}) = table[row, y_{t-2}, y_{t-1}, y_t].
# The state carries the row id and y_{t-2} (so a wrong beam reordering changes the scores) and a scalar step
# counter (a leaf with no batch axis, like the KV cache index).
# ---------------------------------------------------------------------------------------------


def toy_table(seed: int, batch: int, vocab: int, sharpness: float = 2.0, eos_bias: float = 0.0) -> np.ndarray:
    """Normalised log-probs (B, V, V, V); eos_bias shifts eos's logit (negative: longer sequences)."""
    logits = np.random.default_rng(seed).normal(size=(batch, vocab, vocab, vocab)) * sharpness
    logits[..., EOS] += eos_bias
    return np.array(jax.nn.log_softmax(logits, axis=-1))


def toy_model(table: np.ndarray, beam_size: int = 1):
    """-> (step_fn, state) with N = B * beam_size rows."""
    table = jnp.asarray(table)

    def step_fn(state, tokens):  # tokens (N,) y_{t-1}
        log_probs = table[state["row"], state["prev"], tokens]  # (N, V)
        return log_probs, {"row": state["row"], "prev": tokens, "t": state["t"] + 1}

    batch = table.shape[0]
    state = {"row": jnp.arange(batch), "prev": jnp.full((batch,), BOS), "t": jnp.int32(0)}
    return step_fn, tile_beams(state, beam_size)


def toy_log_prob(table: np.ndarray, row: int, seq) -> float:
    prev2, prev1, total = BOS, BOS, 0.0
    for y in seq:
        total += table[row, prev2, prev1, y]
        prev2, prev1 = prev1, y
    return float(total)


def hypothesis(seq) -> list[int]:
    """The tokens of an output row: up to and including the first eos, else all of them."""
    seq = [int(y) for y in seq]
    return seq[: seq.index(EOS) + 1] if EOS in seq else seq


def padded(seq, length: int) -> list[int]:
    return list(seq) + [0] * (length - len(seq))


def brute_force(table: np.ndarray, row: int, max_length: int, alpha: float) -> tuple[list[int], float]:
    """The best finished hypothesis: ends at its first eos (length <= L), or has L tokens and no eos."""
    vocab = table.shape[-1]
    best, best_score = None, -np.inf
    for n in range(1, max_length + 1):
        for seq in itertools.product(range(vocab), repeat=n):
            if EOS in seq[:-1] or (seq[-1] != EOS and n < max_length):
                continue
            score = toy_log_prob(table, row, seq) / ((5 + n) / 6) ** alpha
            if score > best_score:
                best, best_score = list(seq), score
    return best, best_score


def reference_greedy(table: np.ndarray, max_length: int) -> np.ndarray:
    out = np.zeros((table.shape[0], max_length), np.int32)
    for row in range(table.shape[0]):
        prev2, prev1 = BOS, BOS
        for t in range(max_length):
            y = int(np.argmax(table[row, prev2, prev1]))
            out[row, t] = y
            if y == EOS:
                break
            prev2, prev1 = prev1, y
    return out


def test_tile_beams():
    tree = {"a": jnp.arange(6).reshape(2, 3), "index": jnp.int32(5), "b": jnp.arange(3)}
    tiled = tile_beams(tree, 3, batch_size=2)
    np.testing.assert_array_equal(tiled["a"], np.repeat(np.arange(6).reshape(2, 3), 3, axis=0))  # row b*K + k
    assert tiled["index"].shape == () and tiled["b"].shape == (3,)
    assert tile_beams(tree, 2)["b"].shape == (6,)


def test_greedy_is_stepwise_argmax_and_pads_after_eos():
    max_length = 6
    table = toy_table(0, batch=16, vocab=6, eos_bias=-1.0)  # some rows end early, some never
    step_fn, state = toy_model(table)
    out = np.asarray(greedy_search(step_fn, state, 16, BOS, EOS, max_length))
    expected = reference_greedy(table, max_length)
    np.testing.assert_array_equal(out, expected)
    ended = [row for row in out if EOS in row]
    assert any(list(row).index(EOS) < max_length - 1 for row in ended) and len(ended) < len(out)
    for row in ended:
        assert not row[list(row).index(EOS) + 1:].any()  # pad after eos


def test_greedy_stops_when_all_finished():
    table = np.full((2, 6, 6, 6), -5.0, np.float32)
    table[..., EOS] = -0.01  # eos at once everywhere
    step_fn, state = toy_model(table)
    calls = []

    def counting_step(state, tokens):
        jax.debug.callback(lambda: calls.append(1))
        return step_fn(state, tokens)

    out = np.asarray(greedy_search(counting_step, state, 2, BOS, EOS, 7))
    np.testing.assert_array_equal(out, [[EOS] + [0] * 6] * 2)
    assert len(calls) == 1


def test_beam_size_one_is_greedy():
    """K=1 follows the greedy path. It equals greedy when eos is never the runner-up of a step (then no other
    hypothesis is ever finished); otherwise the finished set may keep "greedy prefix + eos", if that scores better."""
    max_length, batch = 7, 8
    table = toy_table(1, batch=batch, vocab=6, eos_bias=-1.0)
    greedy = np.asarray(greedy_search(*toy_model(table), batch, BOS, EOS, max_length))
    seqs, scores = beam_search(*toy_model(table, beam_size=1), batch, 1, BOS, EOS, max_length, length_penalty=0.0)
    greedy_scores = [toy_log_prob(table, row, hypothesis(greedy[row])) for row in range(batch)]
    for row in range(batch):
        hyp = hypothesis(seqs[row])
        np.testing.assert_allclose(scores[row], toy_log_prob(table, row, hyp), rtol=1e-5)
        if hyp != hypothesis(greedy[row]):
            assert hyp[-1] == EOS and hyp[:-1] == list(greedy[row, : len(hyp) - 1])
            assert scores[row] > greedy_scores[row]

    # eos is either the argmax or the least likely token of every step: exactly greedy.
    runner_up = np.argsort(table, axis=-1)[..., -2] == EOS
    table[..., EOS] = np.where(runner_up, table.min(axis=-1) - 1.0, table[..., EOS])
    table = np.array(jax.nn.log_softmax(table, axis=-1))
    greedy = np.asarray(greedy_search(*toy_model(table), batch, BOS, EOS, max_length))
    seqs, scores = beam_search(*toy_model(table, beam_size=1), batch, 1, BOS, EOS, max_length, length_penalty=0.0)
    np.testing.assert_array_equal(seqs, greedy)
    expected = [toy_log_prob(table, row, hypothesis(greedy[row])) for row in range(batch)]
    np.testing.assert_allclose(scores, expected, rtol=1e-5)
    assert any(EOS in row for row in greedy) and not all(EOS in row for row in greedy)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.5])
def test_exhaustive_beam_matches_brute_force(alpha):
    """K = (V-1)^(L-1) keeps every non-eos prefix alive, so beam search is exact."""
    vocab, max_length, batch = 4, 4, 3
    beam = (vocab - 1) ** (max_length - 1)
    table = toy_table(2, batch=batch, vocab=vocab, sharpness=1.5)
    step_fn, state = toy_model(table, beam_size=beam)
    seqs, scores = beam_search(step_fn, state, batch, beam, BOS, EOS, max_length, length_penalty=alpha)
    for row in range(batch):
        best, best_score = brute_force(table, row, max_length, alpha)
        assert list(np.asarray(seqs[row])) == padded(best, max_length)
        np.testing.assert_allclose(scores[row], best_score, rtol=1e-5)


def test_beam_beats_greedy_where_greedy_is_suboptimal():
    """From bos: a (p=.6) then a flat distribution, or b (p=.4) then eos (p=.97). Greedy takes a; K=2 finds b eos."""
    vocab, max_length, a, b = 6, 5, 4, 5
    probs = np.full((1, vocab, vocab, vocab), 1.0 / vocab)
    probs[0, BOS, BOS] = [0, 0, 0, 0, 0.6, 0.4]
    probs[0, BOS, b] = [0.006, 0.006, 0.006, 0.97, 0.006, 0.006]
    table = np.log(np.maximum(probs, 1e-9)).astype(np.float32)
    greedy = np.asarray(greedy_search(*toy_model(table), 1, BOS, EOS, max_length))[0]
    assert greedy[0] == a
    best, best_score = brute_force(table, 0, max_length, 0.6)
    assert best == [b, EOS] and best_score > toy_log_prob(table, 0, hypothesis(greedy)) / gnmt_penalty(
        len(hypothesis(greedy)), 0.6)
    seqs, scores = beam_search(*toy_model(table, beam_size=2), 1, 2, BOS, EOS, max_length, length_penalty=0.6)
    assert list(np.asarray(seqs[0])) == padded(best, max_length)
    np.testing.assert_allclose(scores[0], best_score, rtol=1e-5)


def test_beam_stops_early():
    table = np.full((2, 6, 6, 6), -5.0, np.float32)
    table[..., EOS] = -0.01
    step_fn, state = toy_model(table, beam_size=3)
    calls = []

    def counting_step(state, tokens):
        jax.debug.callback(lambda: calls.append(1))
        return step_fn(state, tokens)

    seqs, _ = beam_search(counting_step, state, 2, 3, BOS, EOS, 9)
    np.testing.assert_array_equal(seqs, [[EOS] + [0] * 8] * 2)
    assert len(calls) < 9


# ---------------------------------------------------------------------------------------------
# Real models: search through the adapters equals decoding by teacher forcing on the growing prefix.
# ---------------------------------------------------------------------------------------------

MAX_LENGTH = 7


def source_batch():
    """(2, 6) sources, the second padded after 3 tokens (eos last, as in lm.data.translation)."""
    source = np.array([[5, 6, 7, 8, 9, EOS], [10, 11, EOS, 0, 0, 0]], np.int32)
    return jnp.asarray(source), jnp.asarray((source != 0).astype(np.int32))


@functools.cache
def seq2seq():
    config = Seq2SeqConfig(source_vocab_size=13, target_vocab_size=11, embed_dim=8, hidden_dim=8,
                           attention="bahdanau")
    model = Seq2Seq(config)
    source, mask = source_batch()
    params = jax.jit(model.init)(jax.random.key(0), source, mask, jnp.zeros((2, 3), jnp.int32))["params"]
    params = nn.unbox(params)
    params["project"]["bias"] = params["project"]["bias"].at[EOS].add(0.6)  # some eos within MAX_LENGTH
    forward = jax.jit(lambda params, inputs: model.apply({"params": params}, source, mask, inputs))
    return model, params, forward


@functools.cache
def transformer():
    blocks = TransformerConfig(num_layers=2, embed_dim=16, num_heads=4, num_kv_heads=2)
    model = EncoderDecoder(EncoderDecoderConfig(source_vocab_size=13, target_vocab_size=11, max_length=16,
                                                transformer=blocks))
    source, mask = source_batch()
    params = nn.unbox(jax.jit(model.init)(jax.random.key(1), source, mask, jnp.zeros((2, 3), jnp.int32))["params"])
    forward = jax.jit(lambda params, inputs: model.apply({"params": params}, source, mask, inputs))
    return model, params, forward


def teacher_forced_greedy(forward, params) -> np.ndarray:
    """Greedy by re-running the full teacher-forced model on [bos] + prefix, argmax at the last position."""
    inputs = np.full((2, MAX_LENGTH), 0, np.int32)
    inputs[:, 0] = BOS
    out = np.zeros((2, MAX_LENGTH), np.int32)
    done = np.zeros(2, bool)
    for t in range(MAX_LENGTH):
        logits = np.asarray(forward(params, jnp.asarray(inputs)))  # (2, L, V), causal: later inputs ignored
        y = np.where(done, 0, logits[:, t].argmax(-1))
        out[:, t] = y
        done |= y == EOS
        if t + 1 < MAX_LENGTH:
            inputs[:, t + 1] = y
    return out


def teacher_forced_score(forward, params, seqs: np.ndarray, alpha: float) -> np.ndarray:
    scores = []
    for row in range(2):
        hyp = hypothesis(seqs[row])
        inputs = np.zeros((2, MAX_LENGTH), np.int32)
        inputs[row, : len(hyp)] = [BOS] + hyp[:-1]
        log_probs = np.asarray(jax.nn.log_softmax(forward(params, jnp.asarray(inputs))[row], axis=-1))
        total = sum(log_probs[t, y] for t, y in enumerate(hyp))
        scores.append(total / ((5 + len(hyp)) / 6) ** alpha)
    return np.array(scores)


def adapter(family, beam_size, alpha=0.6):
    """-> jitted (params, source, mask) -> search output; the adapters run inside jit, params stay traced."""
    model = seq2seq()[0] if family == "seq2seq" else transformer()[0]

    @jax.jit
    def run(params, source, mask):
        if family == "seq2seq":
            memory = model.apply({"params": params}, source, mask, method=Seq2Seq.encode)
            step_fn, state = rnn_step_fn(model, params, memory, beam_size=beam_size)
        else:
            memory = model.apply({"params": params}, source, mask, method=EncoderDecoder.encode)
            step_fn, state = transformer_step_fn(model, params, memory, mask, MAX_LENGTH, beam_size=beam_size)
        if beam_size == 1:
            return greedy_search(step_fn, state, 2, BOS, EOS, MAX_LENGTH)
        return beam_search(step_fn, state, 2, beam_size, BOS, EOS, MAX_LENGTH, length_penalty=alpha)

    return run


@pytest.mark.slow
@pytest.mark.parametrize("family", ["seq2seq", "transformer"])
def test_model_greedy_equals_teacher_forced_greedy(family):
    _, params, forward = seq2seq() if family == "seq2seq" else transformer()
    source, mask = source_batch()
    out = np.asarray(adapter(family, 1)(params, source, mask))
    np.testing.assert_array_equal(out, teacher_forced_greedy(forward, params))


@pytest.mark.parametrize("family", ["seq2seq", "transformer"])
def test_model_beam_score_equals_teacher_forced_score(family):
    """K=3: the returned score is the teacher-forced log-prob of the returned sequence, length-penalised, so the
    state rows (RNN hidden state; KV cache) followed their beams through the reorderings. alpha=3 favours long
    hypotheses (with alpha=0.6 these untrained models pick a lone eos, which would test little)."""
    _, params, forward = seq2seq() if family == "seq2seq" else transformer()
    source, mask = source_batch()
    seqs, scores = adapter(family, 3, alpha=3.0)(params, source, mask)
    seqs = np.asarray(seqs)
    assert all(len(hypothesis(row)) >= 5 for row in seqs)
    np.testing.assert_allclose(scores, teacher_forced_score(forward, params, seqs, 3.0), rtol=1e-4, atol=1e-5)
    for row in seqs:
        assert not row[len(hypothesis(row)):].any()
