"""Context parallelism: the activations' sequence dimension split over the mesh's 'context' axis, attention
gathering the keys and values or passing them round a ring (over the row as it is or in the zig-zag layout), gives
one device's logits and gradients."""

import dataclasses
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm import sharding
from lm.errors import UserError
from lm.layers.attention import CONTEXT_PARALLEL, attention_implementation, layout_order
from lm.layers.transformer import TransformerConfig
from lm.losses import cross_entropy
from lm.models.gpt import GPT, GPTConfig

LENGTH = 16
CONFIG = GPTConfig(vocab_size=11, context_length=LENGTH,
                   transformer=TransformerConfig(num_layers=1, embed_dim=16, num_heads=4, num_kv_heads=2))


def packed_rows(batch: int) -> tuple[jax.Array, jax.Array]:
    """Segment ids (1, 2, ... per document, a padding tail of 0) and positions restarting per document."""
    lengths = [[5, 7, 4], [16], [3, 3, 6, 2], [9, 5]]
    segments, positions = [], []
    for row in (lengths * batch)[:batch]:
        segments.append(np.concatenate([np.full(n, i + 1) for i, n in enumerate(row)]
                                       + [np.zeros(LENGTH - sum(row), int)]))
        positions.append(np.concatenate([np.arange(n) for n in row] + [np.arange(LENGTH - sum(row))]))
    return jnp.asarray(np.stack(segments), jnp.int32), jnp.asarray(np.stack(positions), jnp.int32)


def logits_and_grads(config: GPTConfig, mesh, tokens, targets, packed: bool):
    """The logits and the gradients of the mean loss, on mesh (None: one device) under the default rules."""
    model = GPT(config)
    extra = dict(zip(("segment_ids", "positions"), packed_rows(tokens.shape[0]), strict=True)) if packed else {}

    def run(params):
        def loss(params):
            return model.apply({"params": params}, tokens, targets=targets, **extra).mean()
        return model.apply({"params": params}, tokens, **extra), jax.grad(loss)(params)

    boxed = jax.eval_shape(model.init, jax.random.key(0), tokens)["params"]
    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), tokens)["params"])
    if mesh is None:
        return jax.jit(run)(params)
    with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.DEFAULT_RULES):
        params = jax.device_put(params, sharding.logical_shardings(boxed, mesh, sharding.DEFAULT_RULES))
        compiled = jax.jit(run).lower(params).compile()
        logits, grads = compiled(params)
    assert "context" in sharding.spec_axes(logits.sharding.spec[1])  # the sequence really is split
    collective = "all-gather(" if config.transformer.context_parallel == "all_gather" else "collective-permute("
    assert collective in compiled.as_text()  # the keys and values gathered, or passed round the ring
    return logits, grads


MESHES = [  # (mesh sizes, block options)
    ({"data": 1, "context": 4}, {}),
    ({"data": 2, "context": 2}, {"position": "rope", "attention_softcap": 5.0}),
    ({"data": 1, "fsdp": 2, "context": 2}, {"position": "alibi"}),
]


@pytest.mark.parametrize("form, sizes, blocks, packed", [
    pytest.param(form, *MESHES[2], True, marks=()) for form in CONTEXT_PARALLEL  # the quick tier's cases
] + [
    pytest.param(form, *mesh, packed, marks=pytest.mark.slow) for form in CONTEXT_PARALLEL
    for mesh in MESHES for packed in (False, True) if (mesh, packed) != (MESHES[2], True)
])
def test_context_parallel_logits_and_gradients_equal_one_devices(form, sizes, blocks, packed):
    """Causal GQA attention with learned, RoPE (and soft-capped) or ALiBi positions, whole or packed rows, on
    context=4, data=2 x context=2 and fsdp=2 x context=2, each form: one device's logits and gradients to 1e-5."""
    config = dataclasses.replace(CONFIG, transformer=dataclasses.replace(CONFIG.transformer, context_parallel=form,
                                                                         **blocks))
    tokens = jax.random.randint(jax.random.key(1), (4, LENGTH), 0, config.vocab_size)
    targets = jnp.roll(tokens, -1, axis=1)
    mesh = sharding.make_mesh(sizes, jax.devices()[:4])
    expected = logits_and_grads(config, None, tokens, targets, packed)
    got = logits_and_grads(config, mesh, tokens, targets, packed)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5),
                 got, expected)


@pytest.mark.slow
def test_the_zigzag_ring_on_8_devices_gives_one_devices_logits_losses_gradients_and_chosen_logits():
    """ring_zigzag at context=8 (16 chunks of one token: device i holds tokens i and 15 - i), RoPE, packed rows: the
    logits, the per-token losses, the gradients of their mean and the losses at chosen positions (the eval's
    logit_positions) are one device's to 1e-6."""
    config = dataclasses.replace(CONFIG, transformer=dataclasses.replace(
        CONFIG.transformer, context_parallel="ring_zigzag", position="rope"))
    model = GPT(config)
    tokens = jax.random.randint(jax.random.key(1), (2, LENGTH), 0, config.vocab_size)
    targets = jnp.roll(tokens, -1, axis=1)
    segment_ids, positions = packed_rows(2)
    chosen = jnp.array([[3, 17, 30], [0, 15, 16]])  # b * LENGTH + t

    def run(params):
        def losses(params):
            return model.apply({"params": params}, tokens, targets=targets, segment_ids=segment_ids,
                               positions=positions)
        at_chosen = model.apply({"params": params}, tokens, segment_ids=segment_ids, positions=positions,
                                logit_positions=chosen, targets=targets.reshape(-1)[chosen],
                                logits_reduce=cross_entropy)
        return (model.apply({"params": params}, tokens, segment_ids=segment_ids, positions=positions),
                losses(params), jax.grad(lambda p: losses(p).mean())(params), at_chosen)

    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), tokens)["params"])
    expected = jax.jit(run)(params)
    with jax.set_mesh(sharding.make_mesh({"data": 1, "context": 8})), nn.logical_axis_rules(sharding.DEFAULT_RULES):
        compiled = jax.jit(run).lower(params).compile()
        got = compiled(params)
    assert "collective-permute(" in compiled.as_text()
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6),
                 got, expected)


def test_the_zigzag_layout_gives_device_i_the_chunks_i_and_2n_minus_1_minus_i():
    chunks = layout_order(16, 4, "zigzag").reshape(4, 2, 2) // 2  # per device, its two chunks of 2 tokens
    np.testing.assert_array_equal(chunks[:, :, 0], [[0, 7], [1, 6], [2, 5], [3, 4]])
    np.testing.assert_array_equal(chunks[:, :, 1], chunks[:, :, 0])
    np.testing.assert_array_equal(layout_order(16, 4, "contiguous"), np.arange(16))


@pytest.mark.parametrize("shards", [2, 4, 8])
def test_the_zigzag_ring_gives_every_device_the_same_causal_work_and_skips_only_masked_blocks(shards):
    """Counted over (query chunk, key chunk) pairs of the row's 2n chunks (benchmarks/context_balance.py): the
    contiguous layout needs 4i + 3 pairs of device i and its ring computes all 4n; the zig-zag layout needs 2n + 1
    of every device and its ring computes those and only the masked corner of each device's own block besides, so
    the ring's lockstep cost falls from 4n to 2n + 2."""
    from benchmarks.context_balance import ring_work

    work = {layout: ring_work(shards, layout) for layout in ("contiguous", "zigzag")}
    assert work["contiguous"]["missed"] == work["zigzag"]["missed"] == [0] * shards
    assert work["contiguous"]["needed"] == [4 * i + 3 for i in range(shards)]
    assert work["contiguous"]["computed"] == [4 * shards] * shards
    assert work["zigzag"]["needed"] == [2 * shards + 1] * shards
    assert work["zigzag"]["computed"] == [2 * shards + 2] * shards
    assert (work["zigzag"]["lockstep"], work["contiguous"]["lockstep"]) == (2 * shards + 2, 4 * shards)


def test_zigzag_options_that_do_not_fit_are_one_line():
    """A form not declared, ring_zigzag with mixture-of-experts layers (their slots fill in the row's order), and a
    length the zig-zag chunks do not divide (before the run, and when traced)."""
    with pytest.raises(UserError, match=r"model.context_parallel='zigzag': use one of \('all_gather', 'ring', "):
        TransformerConfig(context_parallel="zigzag")
    with pytest.raises(UserError, match="ring_zigzag reorders each row's tokens, and mixture-of-experts"):
        TransformerConfig(context_parallel="ring_zigzag", moe=dataclasses.replace(TransformerConfig().moe,
                                                                                  num_experts=4))
    mesh = sharding.make_mesh({"data": 1, "context": 4}, jax.devices()[:4])
    with pytest.raises(UserError, match="context_length=12 cannot be split over the 4 devices of mesh.context as 2 "
                                        "chunks each; make it a multiple of 8"):
        sharding.check_context(12, mesh, per_device=2)
    sharding.check_context(12, sharding.make_mesh({"data": 1, "context": 1}, jax.devices()[:1]), per_device=2)
    config = dataclasses.replace(CONFIG, context_length=12, transformer=dataclasses.replace(
        CONFIG.transformer, context_parallel="ring_zigzag"))
    with pytest.raises(UserError, match=r"12 tokens cannot be split over the 4 devices of mesh.context as 2 chunks "
                                        r"each \(model.context_parallel=ring_zigzag\); make the sequence length a "
                                        "multiple of 8"):
        logits_and_grads(config, mesh, jnp.zeros((2, 12), jnp.int32), jnp.zeros((2, 12), jnp.int32), packed=False)


def test_a_sequence_the_context_axis_does_not_divide_is_one_line():
    mesh = sharding.make_mesh({"data": 1, "context": 4}, jax.devices()[:4])
    tokens = jnp.zeros((2, 14), jnp.int32)
    config = dataclasses.replace(CONFIG, context_length=14)
    with pytest.raises(UserError, match="14 tokens cannot be split over the 4 devices of mesh.context"):
        logits_and_grads(config, mesh, tokens, tokens, packed=False)
    with pytest.raises(UserError, match="data.context_length=14 cannot be split over the 4 devices of mesh.context"):
        sharding.check_context(14, mesh)
    sharding.check_context(16, mesh)


def logged_losses(workdir) -> dict[int, float]:
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


@pytest.mark.slow
@pytest.mark.parametrize("form", CONTEXT_PARALLEL)
def test_a_run_at_context_4_and_a_resume_on_another_context_size_equal_one_devices(form, tmp_path, data_dir,
                                                                                   test_config):
    """30 steps of configs/gpt_shakespeare.py:test (with dropout, and for all_gather attention dropout: the masks
    must not depend on the layout) at mesh.context=4 log one device's losses; so does a run of 15 steps at
    context=2 resumed at context=4. ring_zigzag runs without dropout: its masks fall on the tokens in the zig-zag
    order, so they are other draws than one device's."""
    from lm.cli.resolve import build_experiment
    from lm.train.loop import train

    test_config.train.update(num_steps=30, log_every=1, checkpoint_every=15)
    test_config.optimizer.decay_steps = 30  # the schedule of the whole run, also in its first half
    test_config.model.update(dropout=0.0 if form == "ring_zigzag" else 0.1,
                             attention_dropout=0.1 if form == "all_gather" else 0.0)
    train(test_config, str(tmp_path / "one"), build_experiment, devices=jax.devices()[:1])
    test_config.mesh.update(data=1, context=4)
    test_config.model.context_parallel = form
    train(test_config, str(tmp_path / "context"), build_experiment, devices=jax.devices()[:4])
    test_config.mesh.update(context=2)
    test_config.train.num_steps = 15
    train(test_config, str(tmp_path / "resumed"), build_experiment, devices=jax.devices()[:2])
    test_config.mesh.update(context=4)
    test_config.train.num_steps = 30
    train(test_config, str(tmp_path / "resumed"), build_experiment, devices=jax.devices()[:4])
    one = logged_losses(tmp_path / "one")
    assert len(one) == 30
    for run in ("context", "resumed"):
        got = logged_losses(tmp_path / run)
        assert got.keys() == one.keys(), run
        np.testing.assert_allclose([got[s] for s in one], [one[s] for s in one], rtol=1e-5, err_msg=run)


def test_the_ring_takes_no_attention_dropout():
    config = dataclasses.replace(CONFIG, transformer=dataclasses.replace(
        CONFIG.transformer, context_parallel="ring", attention_dropout=0.1))
    tokens = jnp.zeros((2, LENGTH), jnp.int32)
    params = nn.unbox(jax.jit(GPT(config).init)(jax.random.key(0), tokens)["params"])
    mesh = sharding.make_mesh({"data": 1, "context": 2}, jax.devices()[:2])
    with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.DEFAULT_RULES), \
            pytest.raises(UserError, match="use model.context_parallel=all_gather"):
        GPT(config).apply({"params": params}, tokens, train=True, rngs={"dropout": jax.random.key(1)})


def test_a_sequence_split_over_devices_runs_attention_on_xla():
    """auto picks XLA, not splash or cuDNN, for a split sequence; asking for either is one line."""
    assert attention_implementation("auto", "tpu", jnp.float32, 64, (256, 256), False) == "splash"
    assert attention_implementation("auto", "tpu", jnp.float32, 64, (256, 256), False, context_split=True) == "xla"
    assert attention_implementation("auto", "gpu", jnp.bfloat16, 64, (256, 256), False, context_split=True) == "xla"
    with pytest.raises(UserError, match="needs a mesh without a context axis"):
        attention_implementation("cudnn", "gpu", jnp.bfloat16, 64, (256, 256), False, context_split=True)
