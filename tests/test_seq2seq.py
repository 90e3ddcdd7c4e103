"""Recurrent seq2seq models: attention math, padding invariance, step/teacher-forcing agreement, the bottleneck."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lm.errors import UserError
from lm.layers.rnn import AdditiveAttention, masked_softmax
from lm.models.seq2seq import Memory, Seq2Seq, Seq2SeqConfig

SRC_V, TGT_V = 11, 13


def tiny(attention: str, cell: str = "gru", **kw) -> Seq2SeqConfig:
    return Seq2SeqConfig(SRC_V, TGT_V, embed_dim=8, hidden_dim=6, cell=cell, attention=attention, **kw)


def batch(seed: int = 0, b: int = 3, s: int = 5, t: int = 4):
    """Right-padded source with lengths 5, 3, 1 (row lengths chosen so padding is present)."""
    rng = np.random.default_rng(seed)
    lengths = np.array([s, 3, 1])[:b]
    mask = (np.arange(s)[None, :] < lengths[:, None]).astype(np.int32)  # (B, S)
    source = rng.integers(4, SRC_V, (b, s)) * mask  # (B, S)
    decoder_inputs = rng.integers(4, TGT_V, (b, t))  # (B, T)
    return jnp.asarray(source, jnp.int32), jnp.asarray(mask), jnp.asarray(decoder_inputs, jnp.int32)


@functools.cache
def init(config: Seq2SeqConfig):
    source, mask, decoder_inputs = batch()
    model = Seq2Seq(config)
    return model, nn.unbox(model.init(jax.random.key(1), source, mask, decoder_inputs))


def test_bahdanau_attention_matches_numpy():
    b, s, h, d, a = 2, 4, 3, 5, 7
    rng = np.random.default_rng(0)
    query = rng.normal(size=(b, h)).astype(np.float32)  # s_{t-1}
    values = rng.normal(size=(b, s, d)).astype(np.float32)  # h_i
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.int32)
    module = AdditiveAttention(a)

    def run(m, q, v, mask):
        return m(q, m.keys(v), v, mask)

    params = nn.unbox(module.init(jax.random.key(0), query, values, mask, method=run))["params"]
    context, weights = module.apply({"params": params}, query, values, mask, method=run)

    w_s, w_h = np.asarray(params["query"]["kernel"]), np.asarray(params["key"]["kernel"])  # (H, A), (D, A)
    v = np.asarray(params["energy"]["kernel"])[:, 0]  # (A,)
    e = np.tanh((query @ w_s)[:, None, :] + values @ w_h) @ v  # (B, S)
    e = np.where(mask == 1, e, -np.inf)
    expected_w = np.exp(e - e.max(-1, keepdims=True))
    expected_w /= expected_w.sum(-1, keepdims=True)  # (B, S)
    expected_c = np.einsum("bs,bsd->bd", expected_w, values)  # (B, D)
    np.testing.assert_allclose(weights, expected_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(context, expected_c, rtol=1e-5, atol=1e-6)


def test_masked_softmax_dummy_row_is_finite_and_padding_is_zero():
    scores = jnp.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    mask = jnp.array([[1, 1, 0], [0, 0, 0]])
    w = masked_softmax(scores, mask)
    assert np.all(np.isfinite(w))
    assert w[0, 2] == 0.0
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize(
    "attention,cell",
    [(a, "gru") for a in ("none", "bahdanau", "luong_general")] + [("bahdanau", "lstm")],  # (luong_dot: luong's mask)
)
def test_extra_source_padding_leaves_logits_unchanged(attention, cell):
    model, variables = init(tiny(attention, cell))
    source, mask, decoder_inputs = batch()
    pad = 3
    longer_source = jnp.pad(source, ((0, 0), (0, pad)))  # (B, S + 3), pad id 0
    longer_mask = jnp.pad(mask, ((0, 0), (0, pad)))  # (B, S + 3)
    # Garbage ids under the mask must not matter either: only seq_lengths and the mask decide what is real.
    garbage_source = jnp.where(longer_mask > 0, longer_source, 7)

    def run(variables):  # eager: cheaper than compiling three applies on 2 CPU cores
        short = model.apply(variables, source, mask, decoder_inputs)
        long = model.apply(variables, garbage_source, longer_mask, decoder_inputs)
        # The check has teeth: unmasking the padding changes the logits.
        changed = model.apply(variables, garbage_source, jnp.ones_like(longer_mask), decoder_inputs)
        return short, long, changed

    short, long, changed = run(variables)
    assert short.shape == (3, 4, TGT_V)
    np.testing.assert_allclose(short, long, rtol=1e-5, atol=1e-5)
    assert np.max(np.abs(np.asarray(changed) - np.asarray(short))) > 1e-4


@pytest.mark.parametrize("attention", ["bahdanau", "luong_general"])
def test_padding_gets_exactly_zero_attention(attention):
    model, variables = init(tiny(attention))
    source, mask, decoder_inputs = batch()
    logits, state = model.apply(
        variables, source, mask, decoder_inputs, capture_weights=True, mutable=["intermediates"]
    )
    (weights,) = state["intermediates"]["attention_weights"]  # (B, T, S)
    assert weights.shape == (3, 4, 5)
    padding = np.broadcast_to(np.asarray(mask)[:, None, :] == 0, weights.shape)
    assert np.all(np.asarray(weights)[padding] == 0.0)
    assert np.all(np.asarray(weights)[~padding] > 0.0)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
    # The one-token row attends only to its token.
    np.testing.assert_allclose(weights[2, :, 0], 1.0, rtol=1e-6)


@pytest.mark.parametrize(
    "attention,cell", [("none", "gru"), ("bahdanau", "gru"), ("luong_general", "gru"), ("bahdanau", "lstm")]
)
def test_decode_step_equals_teacher_forcing(attention, cell):
    model, variables = init(tiny(attention, cell))
    source, mask, decoder_inputs = batch()
    teacher, inter = model.apply(
        variables, source, mask, decoder_inputs, capture_weights=True, mutable=["intermediates"]
    )  # (B, T, V)
    (teacher_weights,) = inter["intermediates"]["attention_weights"]  # (B, T, S)
    memory = model.apply(variables, source, mask, method=Seq2Seq.encode)
    state = model.apply(variables, memory, method=Seq2Seq.initial_state)
    step = jax.jit(functools.partial(model.apply, variables, method=Seq2Seq.decode_step))
    stepped, stepped_weights = [], []
    for t in range(decoder_inputs.shape[1]):
        logits, state, weights = step(memory, state, decoder_inputs[:, t])  # (B, V), state, (B, S)
        for leaf in jax.tree.leaves(state):
            assert leaf.shape[0] == 3  # every state leaf is batch-leading (beam search gathers rows)
        stepped.append(logits)
        stepped_weights.append(weights)
    np.testing.assert_allclose(jnp.stack(stepped, 1), teacher, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jnp.stack(stepped_weights, 1), teacher_weights, rtol=1e-5, atol=1e-6)


def test_no_attention_sees_the_source_only_through_the_final_state():
    model, variables = init(tiny("none"))
    source, mask, decoder_inputs = batch()
    memory = model.apply(variables, source, mask, method=Seq2Seq.encode)
    assert memory.keys is None
    decode = jax.jit(functools.partial(model.apply, variables, method=Seq2Seq.decode))
    logits = decode(memory, decoder_inputs)  # (B, T, V)
    scrambled = memory.replace(outputs=jax.random.normal(jax.random.key(3), memory.outputs.shape))
    np.testing.assert_array_equal(decode(scrambled, decoder_inputs), logits)
    # ... while the final state is used, and attention over the outputs would see the scramble.
    moved = memory.replace(final=memory.final + 1.0)
    assert np.max(np.abs(np.asarray(decode(moved, decoder_inputs)) - np.asarray(logits))) > 1e-4
    model_b, variables_b = init(tiny("bahdanau"))
    memory_b = model_b.apply(variables_b, source, mask, method=Seq2Seq.encode)
    decode_b = jax.jit(functools.partial(model_b.apply, variables_b, method=Seq2Seq.decode))
    scrambled_b = memory_b.replace(outputs=memory_b.outputs + 1.0)
    difference = np.asarray(decode_b(scrambled_b, decoder_inputs)) - np.asarray(decode_b(memory_b, decoder_inputs))
    assert np.max(np.abs(difference)) > 1e-4
    assert isinstance(memory, Memory)


def masked_cross_entropy(logits, targets, target_mask):
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)  # (B, T)
    return jnp.sum(ce * target_mask) / jnp.maximum(jnp.sum(target_mask), 1)


def reverse_task(n: int = 64, length: int = 5, tokens: int = 10, seed: int = 0):
    """Reverse sequences of 3..length tokens (ids 4..4+tokens), in the translation batch format."""
    rng = np.random.default_rng(seed)
    seq_len = length + 1  # + eos
    source = np.zeros((n, seq_len), np.int32)
    decoder_inputs = np.zeros((n, seq_len), np.int32)
    targets = np.zeros((n, seq_len), np.int32)
    for i in range(n):
        k = rng.integers(3, length + 1)
        x = rng.integers(4, 4 + tokens, k)
        source[i, : k + 1] = [*x, 3]
        y = x[::-1]
        decoder_inputs[i, : k + 1] = [2, *y]
        targets[i, : k + 1] = [*y, 3]
    return {
        "source": source,
        "source_mask": (source != 0).astype(np.int32),
        "decoder_inputs": decoder_inputs,
        "targets": targets,
        "target_mask": (targets != 0).astype(np.int32),
    }


@pytest.mark.slow
def test_bahdanau_overfits_reversal():
    data = {k: jnp.asarray(v) for k, v in reverse_task().items()}
    config = Seq2SeqConfig(16, 16, embed_dim=16, hidden_dim=32, attention="bahdanau")
    model = Seq2Seq(config)
    params = nn.unbox(model.init(jax.random.key(0), data["source"], data["source_mask"], data["decoder_inputs"]))
    optimizer = optax.adam(1e-2)

    def loss_fn(params):
        logits = model.apply(params, data["source"], data["source_mask"], data["decoder_inputs"], train=True)
        loss = masked_cross_entropy(logits, data["targets"], data["target_mask"])
        correct = (jnp.argmax(logits, -1) == data["targets"]) * data["target_mask"]  # (B, T)
        return loss, jnp.sum(correct) / jnp.sum(data["target_mask"])

    @jax.jit
    def train(params):
        def step(carry, _):
            params, opt_state = carry
            (loss, acc), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
            updates, opt_state = optimizer.update(grads, opt_state)
            return (optax.apply_updates(params, updates), opt_state), (loss, acc)

        (params, _), (losses, accs) = jax.lax.scan(step, (params, optimizer.init(params)), None, length=120)
        return params, losses, accs

    params, losses, accs = train(params)
    _, final_acc = loss_fn(params)
    assert losses[-1] < 0.1 * losses[0]
    assert final_acc >= 0.95, f"teacher-forced token accuracy {final_acc:.3f}"


@pytest.mark.parametrize("field,value", [("cell", "rnn"), ("attention", "luong")])
def test_unknown_options_raise_user_error(field, value):
    with pytest.raises(UserError, match=f"model.{field}="):
        tiny(**{"attention": "bahdanau", field: value})
