"""Packing by document: best-fit rows against a direct reference, and a packed row computing what its
documents compute alone (attention and loss never cross a boundary) on every attention path."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm.data.packing import best_fit, examples, pack_documents, padding_fraction, split_documents
from lm.errors import UserError
from lm.layers.attention import attention_implementation
from lm.layers.embedding import TokenEmbedding
from lm.losses import cross_entropy

VOCAB, LENGTH = 11, 12
DOCUMENT_LENGTHS = (7, 6, 5, 4, 2)  # rows of 13: [7 6], [5 4 2 + 2 padding]


def reference_best_fit(sizes: list[int], capacity: int) -> list[list[int]]:
    """Best-fit-decreasing by scanning every row: the longest item first (ties in input order) into the
    row with the least room that still fits it (ties: the lowest row), else a new row."""
    rows, rooms = [], []
    for item in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        fitting = [(room, row) for row, room in enumerate(rooms) if room >= sizes[item]]
        if fitting:
            _, row = min(fitting)
        else:
            row = len(rows)
            rows.append([])
            rooms.append(capacity)
        rows[row].append(item)
        rooms[row] -= sizes[item]
    return rows


def numbered_documents(lengths) -> list[np.ndarray]:
    """Documents whose tokens say where they come from: document d's token i is 1000 (d + 1) + i."""
    return [1000 * (d + 1) + np.arange(n, dtype=np.int32) for d, n in enumerate(lengths)]


def test_best_fit_equals_the_direct_reference():
    rng = np.random.default_rng(0)
    for capacity in (1, 7, 64):
        sizes = rng.integers(1, capacity + 1, size=300).tolist()
        assert best_fit(sizes, capacity) == reference_best_fit(sizes, capacity)
    assert best_fit([], 5) == []


def test_packing_keeps_every_token_once_in_document_order():
    """Random documents, some longer than a row, some empty: every token lands exactly once; each
    segment is a run of consecutive tokens of one document starting where a row-sized piece starts;
    segment ids count 1, 2, ... along a row with padding (pad_id, segment 0, position 0) only at its end;
    positions count from each segment's start; and packing again gives the same rows."""
    length, pad_id = 15, -1
    lengths = np.random.default_rng(1).integers(0, 40, size=60)
    documents = numbered_documents(lengths)
    rows = pack_documents(documents, length, pad_id)
    width = length + 1
    assert rows.tokens.shape == rows.segment_ids.shape == rows.positions.shape == (len(rows.tokens), width)
    seen = []
    for tokens, segments, positions in zip(rows.tokens, rows.segment_ids, rows.positions, strict=True):
        used = np.count_nonzero(segments)
        assert np.all(segments[:used] > 0) and np.all(tokens[used:] == pad_id) and np.all(positions[used:] == 0)
        assert np.array_equal(np.unique(segments[:used]), np.arange(1, segments[:used].max(initial=0) + 1))
        assert np.all(np.diff(segments[:used]) >= 0)
        for segment in range(1, segments.max() + 1):
            piece = tokens[segments == segment]
            document, first = divmod(int(piece[0]), 1000)
            assert first % width == 0 and len(piece) == min(width, lengths[document - 1] - first)
            assert np.array_equal(piece, piece[0] + np.arange(len(piece)))  # one document, in order
            assert np.array_equal(positions[segments == segment], np.arange(len(piece)))
            seen.append(piece)
    everything = np.sort(np.concatenate(seen))
    assert np.array_equal(everything, np.sort(np.concatenate(documents)))
    assert any(n > width for n in lengths)  # some documents were split
    again = pack_documents(documents, length, pad_id)
    assert all(np.array_equal(a, b) for a, b in zip(vars(rows).values(), vars(again).values(), strict=True))
    assert padding_fraction(rows) == np.mean(rows.tokens == pad_id)


def test_weights_are_zero_exactly_across_boundaries_and_on_padding():
    """A weight is 1 exactly where the target is the next token of the input's own document."""
    lengths = np.random.default_rng(2).integers(1, 30, size=40)
    batch = examples(pack_documents(numbered_documents(lengths), 10, pad_id=0))
    inputs, targets = batch["inputs"], batch["targets"]
    continues = (targets == inputs + 1) & (targets // 1000 == inputs // 1000) & (inputs > 0)
    assert np.array_equal(batch["weights"], continues.astype(np.float32))
    assert batch["weights"].dtype == np.float32 and batch["inputs"].shape == (len(inputs), 10)
    assert np.array_equal(batch["segment_ids"], pack_documents(numbered_documents(lengths), 10).segment_ids[:, :-1])


def test_split_documents_cuts_row_sized_pieces():
    pieces = split_documents([np.arange(7), np.arange(0), np.arange(3)], 3)
    assert [p.tolist() for p in pieces] == [[0, 1, 2], [3, 4, 5], [6], [0, 1, 2]]


# --- the model on packed rows --------------------------------------------------------------------------

DOCUMENTS = [(0, 1), (0, 2), (1, 1), (1, 2), (1, 3)]  # (row, segment) of each document of packed_batch


def experiment(**model):
    """The language-model experiment with a tiny fp32 GPT (2 layers, 4 heads, 2 key/value heads, 16
    wide) on ids < VOCAB in rows of LENGTH."""
    from configs import base
    from experiments.language_model import build

    config = base.language_model("token_file")
    config.data.update(dataset="synthetic", vocab_size=VOCAB, context_length=LENGTH)
    config.model.update({"num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "embed_dim": 16, **model})
    return build(config)


@functools.cache
def initial_params(position: str = "learned") -> dict:
    """The tiny GPT's initial parameters with these positions (the same whatever the attention or loss
    options)."""
    return nn.unbox(jax.jit(experiment(position=position).init)(jax.random.key(0))["params"])


def packed_batch(seed=3) -> dict[str, np.ndarray]:
    """Random documents of DOCUMENT_LENGTHS packed into 2 rows of LENGTH inputs, as a batch."""
    rng = np.random.default_rng(seed)
    documents = [rng.integers(0, VOCAB, size=n).astype(np.int32) for n in DOCUMENT_LENGTHS]
    batch = examples(pack_documents(documents, LENGTH))
    assert batch["inputs"].shape == (2, LENGTH) and batch["weights"][1, -2:].sum() == 0  # padding in row 2
    return batch


def alone(batch: dict[str, np.ndarray], key: str) -> np.ndarray:
    """batch[key] of each document of the packed rows as a row of its own, zeros after it: (5, LENGTH)."""
    rows = np.zeros((len(DOCUMENTS), LENGTH), batch[key].dtype)
    for i, (row, segment) in enumerate(DOCUMENTS):
        where = batch["segment_ids"][row] == segment
        rows[i, :where.sum()] = batch[key][row, where]
    return rows


@functools.partial(jax.jit, static_argnames=("model", "capture_weights"))
def logits(model, params, inputs, segment_ids=None, positions=None, capture_weights=False):
    return model.apply({"params": params}, inputs, segment_ids=segment_ids, positions=positions,
                       capture_weights=capture_weights, mutable=["intermediates"])[0]


@pytest.mark.parametrize("position", ["learned", "rope"])  # (ALiBi takes (B, T) positions as RoPE does)
def test_a_packed_row_gives_each_document_its_logits_alone(position):
    """fp32, atol 1e-5: each document's inputs in a packed row (fused XLA attention and the explicit
    softmax path) give the logits of the same inputs run unpacked as a row of their own (padded after
    them, which a causal model does not see)."""
    built, params, batch = experiment(position=position), initial_params(position), packed_batch()
    packed = [jnp.asarray(batch[key]) for key in ("inputs", "segment_ids", "positions")]
    fused = logits(built.model, params, *packed)
    explicit = logits(built.model, params, *packed, capture_weights=True)
    unpacked = logits(built.model, params, alone(batch, "inputs"))
    for i, (row, segment) in enumerate(DOCUMENTS):
        where = batch["segment_ids"][row] == segment
        np.testing.assert_allclose(fused[row, where], unpacked[i, :where.sum()], atol=1e-5)
        np.testing.assert_allclose(explicit[row, where], unpacked[i, :where.sum()], atol=1e-5)


def embedding_offsets(offset: jax.Array):
    """An interceptor adding offset (B, T, D) to the token embeddings: its gradient is the loss's
    gradient with respect to each input token."""

    def intercept(next_fun, args, kwargs, context):
        out = next_fun(*args, **kwargs)
        return out + offset if isinstance(context.module, TokenEmbedding) and context.method_name == "__call__" else out

    return nn.intercept_methods(intercept)


def test_no_attention_or_loss_crosses_a_document_boundary():
    """The loss terms of each document of a packed row (LanguageModel.loss with the batch's weights kept
    on that document only) have a zero gradient with respect to every token outside it, and a nonzero
    one with respect to each of its tokens whose own prediction counts."""
    built, params, batch = experiment(), initial_params(), packed_batch()

    @jax.jit
    @jax.grad
    def document_loss(offset, weights):
        with embedding_offsets(offset):
            return built.loss(params, {**batch, "weights": weights}, jax.random.key(0), train=False)[0]

    for row, segment in DOCUMENTS:
        own = (np.arange(2)[:, None] == row) & (batch["segment_ids"] == segment)
        token_grads = np.abs(np.asarray(document_loss(jnp.zeros((2, LENGTH, 16)), batch["weights"] * own))).sum(-1)
        assert np.all(token_grads[~own] == 0)
        assert np.all(token_grads[own & (batch["weights"] > 0)] > 0)


@pytest.mark.parametrize("loss_chunk", [0, 4])
def test_the_packed_loss_is_the_token_mean_over_the_documents_alone(loss_chunk):
    """LanguageModel.loss of a packed batch (whole or in chunks of 4 positions) equals the mean next-token
    loss over the documents' predictions, each document run alone: no prediction across a boundary."""
    built, params, batch = experiment(loss_chunk=loss_chunk), initial_params(), packed_batch()
    loss, metrics = jax.jit(built.loss, static_argnames="train")(params, batch, jax.random.key(0), train=False)
    unpacked = logits(experiment().model, params, alone(batch, "inputs"))
    predictions = alone(batch, "weights") > 0
    assert predictions.sum() == sum(n - 1 for n in DOCUMENT_LENGTHS)  # (the rows end with whole documents)
    expected = cross_entropy(unpacked, alone(batch, "targets"))[predictions].mean()
    np.testing.assert_allclose(metrics["cross_entropy"], expected, rtol=1e-6)
    np.testing.assert_allclose(loss, metrics["cross_entropy"], rtol=1e-6)


def test_attention_on_packed_rows_picks_cudnn_on_a_gpu_and_splash_on_a_tpu():
    """cuDNN takes packed rows as a mask, its training kernel at even lengths only (else XLA, or an error when
    asked for by name)."""
    bf16 = jnp.bfloat16
    assert attention_implementation("auto", "gpu", bf16, 64, (1024, 1024), False, has_segments=True) == "cudnn"
    assert attention_implementation("auto", "gpu", bf16, 64, (1023, 1023), False, has_segments=True) == "xla"
    assert attention_implementation("auto", "gpu", bf16, 64, (1023, 1023), False) == "cudnn"  # one document a row
    assert attention_implementation("auto", "tpu", bf16, 64, (1024, 1024), False, has_segments=True) == "splash"
    with pytest.raises(UserError, match="model.attention_impl=cudnn needs even sequence lengths for packed rows"):
        attention_implementation("cudnn", "gpu", bf16, 64, (1023, 1023), False, has_segments=True)


def test_packed_rows_reach_cudnn_as_their_documents_mask(monkeypatch):
    """On a GPU (the backend's name patched), a bf16 model's packed rows call jax.nn.dot_product_attention with
    implementation='cudnn', causal, and the (B, 1, T, T) mask of their documents; run on XLA here, that call's
    loss is the attention_impl=xla model's."""
    calls = []
    attention = jax.nn.dot_product_attention

    def on_xla(*args, implementation=None, **kwargs):
        calls.append((implementation, kwargs["mask"].shape, kwargs["is_causal"]))
        return attention(*args, implementation="xla", **kwargs)

    model = {"compute_dtype": "bfloat16", "embed_dim": 32}  # head dim 8
    def loss(built):
        return jax.jit(functools.partial(built.loss, train=False))(params, batch, jax.random.key(0))[0]

    params, batch = nn.unbox(jax.jit(experiment(**model).init)(jax.random.key(0))["params"]), packed_batch()
    expected = loss(experiment(attention_impl="xla", **model))
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(jax.nn, "dot_product_attention", on_xla)
    assert loss(experiment(**model)) == expected
    assert calls == [("cudnn", (2, 1, LENGTH, LENGTH), True)] * 2  # each of the 2 layers


@pytest.mark.slow
def test_splash_attention_with_segment_ids_equals_xla_on_a_sharded_mesh():
    """Packed rows (segment ids) through the Pallas kernel (interpreted on CPU) in its shard_map over a
    data 2 x tensor 2 mesh: the output and gradients of XLA's masked attention."""
    from lm import sharding
    from lm.layers.attention import MultiHeadAttention

    mesh = sharding.make_mesh({"data": 2, "fsdp": 1, "expert": 1, "tensor": 2}, jax.devices()[:4])
    x = jax.random.normal(jax.random.key(0), (2, 128, 32))
    segment_ids = jnp.asarray([[1] * 50 + [2] * 40 + [3] * 30 + [0] * 8, [1] * 100 + [2] * 28])

    def loss_and_grads(implementation):
        layer = MultiHeadAttention(num_heads=4, num_kv_heads=2, head_dim=8, causal=True, implementation=implementation)
        params = layer.init(jax.random.key(1), x)
        loss = jax.value_and_grad(lambda p, x: jnp.sum(layer.apply(p, x, segment_ids=segment_ids) ** 2), (0, 1))
        return jax.jit(loss)(params, x)

    expected = loss_and_grads("xla")
    with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.DEFAULT_RULES):
        got = loss_and_grads("splash")
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-4, atol=1e-5), got, expected)
