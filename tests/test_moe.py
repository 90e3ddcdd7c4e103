"""The mixture-of-experts layer against a per-token reference, its statistics, capacity and sharding."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from lm import sharding
from lm.layers.moe import EXPERTS_NAME, MoeMlp, parameter_counts
from lm.losses import moe_objective

MESH_RULES = list(sharding.DEFAULT_RULES)


def make_moe(num_experts=4, top_k=1, capacity_factor=4.0, kind="gelu", hidden_dim=16, **kwargs):
    return MoeMlp(num_experts, top_k, capacity_factor, kind, hidden_dim, **kwargs)


def init_params(model, x, seed=0):
    return nn.unbox(model.init(jax.random.key(seed), x)["params"])


def forward(model, params, x):
    """(output, stats) with the stats of the one MoE layer."""
    y, moe = model.apply({"params": params}, x, mutable=["moe"])
    (stats,) = moe["moe"]["stats"]
    return y, stats


def randomized(params, seed=1, scale=0.5):
    """Every parameter (biases and router too) redrawn from N(0, scale^2), so all of them matter."""
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return tree.unflatten([scale * jax.random.normal(k, p.shape) for k, p in zip(keys, leaves, strict=True)])


def gelu_tanh(h):
    return 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))


def reference_expert(params, kind, e, token):
    """Expert e's feed-forward on one token (D,), straight from the parameter arrays."""
    experts = jax.tree.map(np.asarray, params[EXPERTS_NAME])

    def project(name):
        return token @ experts[name]["kernel"][e] + experts[name]["bias"][e]

    if kind == "swiglu":
        up = project("gate")
        hidden = up / (1 + np.exp(-up)) * project("up")
    else:
        hidden = gelu_tanh(project("up"))
    return hidden @ experts["down"]["kernel"][e] + experts["down"]["bias"][e]


def router_probs(params, x):
    logits = np.asarray(x, np.float64) @ np.asarray(params["router"]["kernel"], np.float64)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    return logits, probs / probs.sum(-1, keepdims=True)


def reference_moe(params, kind, top_k, x, choices_kept=None):
    """sum over a token's kept choices of gate * expert(token), one token at a time (no capacity)."""
    x = np.asarray(x)
    _, probs = router_probs(params, x)
    out = np.zeros_like(x)
    for b, t in np.ndindex(x.shape[:2]):
        chosen = np.argsort(-probs[b, t], kind="stable")[:top_k]
        gates = probs[b, t, chosen] if top_k == 1 else probs[b, t, chosen] / probs[b, t, chosen].sum()
        for e, gate in list(zip(chosen, gates, strict=True))[:choices_kept]:
            out[b, t] += gate * reference_expert(params, kind, e, x[b, t])
    return out


@pytest.mark.parametrize("kind, top_k", [("gelu", 1), ("gelu", 2), ("swiglu", 1), ("swiglu", 2)])
def test_matches_per_token_reference_when_nothing_drops(kind, top_k):
    x = jax.random.normal(jax.random.key(0), (2, 8, 8))
    model = make_moe(top_k=top_k, capacity_factor=4.0, kind=kind)  # capacity factor E: room for every token
    params = randomized(init_params(model, x))
    y, stats = forward(model, params, x)
    np.testing.assert_allclose(y, reference_moe(params, kind, top_k, x), atol=1e-5, rtol=1e-5)
    assert float(stats["dropped_fraction"]) == 0.0
    assert y.shape == x.shape and y.dtype == jnp.float32


def test_bfloat16_compute_keeps_float32_params_and_routing():
    x = jax.random.normal(jax.random.key(0), (2, 8, 8))
    model = make_moe(top_k=2, dtype=jnp.bfloat16)
    params = init_params(model, x)
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
    params = randomized(params)
    y, stats = forward(model, params, x)
    y32, stats32 = forward(make_moe(top_k=2), params, x)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_allclose(y.astype(jnp.float32), y32, atol=5e-2, rtol=5e-2)
    for name in stats:  # the router runs in float32 either way
        np.testing.assert_array_equal(stats[name], stats32[name])


def test_router_z_loss_is_mean_squared_logsumexp():
    x = jax.random.normal(jax.random.key(0), (2, 8, 8))
    model = make_moe(top_k=2)
    params = randomized(init_params(model, x), scale=2.0)
    _, stats = forward(model, params, x)
    logits, _ = router_probs(params, x)
    top = logits.max(-1)
    logsumexp = top + np.log(np.exp(logits - top[..., None]).sum(-1))
    np.testing.assert_allclose(stats["router_z_loss"], np.mean(logsumexp**2), rtol=1e-5)


def routed(first, second, strength=3.0):
    """A (D=E=4,) token whose router logits (identity router kernel) rank `first`, then `second`."""
    token = np.zeros(4, np.float32)
    token[first], token[second] = strength, strength / 2
    return token


@pytest.mark.parametrize("top_k", [1, 2])
def test_load_balance_loss_is_one_under_uniform_routing(top_k):
    # Token t prefers expert t mod 4, then t + 1 mod 4: every expert gets the same number of
    # first (and second) choices, and by symmetry the mean router probabilities are uniform.
    x = np.stack([routed(t % 4, (t + 1) % 4) for t in range(8)])[None].repeat(2, axis=0)
    model = make_moe(top_k=top_k)
    params = init_params(model, x)
    params["router"]["kernel"] = jnp.eye(4)
    _, stats = forward(model, params, x)
    np.testing.assert_allclose(stats["expert_fraction"], np.full(4, 0.25), atol=1e-7)
    np.testing.assert_allclose(stats["load_balance_loss"], 1.0, rtol=1e-6)


def test_load_balance_loss_when_every_token_picks_one_expert():
    x = jax.random.uniform(jax.random.key(0), (2, 8, 4), minval=0.5, maxval=1.0)
    model = make_moe(top_k=1)
    params = init_params(model, x)
    params["router"]["kernel"] = jnp.zeros((4, 4)).at[:, 2].set(1.0)  # logits (s, 0, s, 0) → expert 2
    _, stats = forward(model, params, x)
    _, probs = router_probs(params, x)
    np.testing.assert_allclose(stats["expert_fraction"], [0, 0, 1, 0])
    np.testing.assert_allclose(stats["load_balance_loss"], 4 * 1.0 * probs[..., 2].mean(), rtol=1e-5)
    assert float(stats["load_balance_loss"]) > 2.0  # well above the balanced value 1


def test_full_expert_drops_the_later_tokens():
    x = jax.random.uniform(jax.random.key(0), (2, 8, 4), minval=0.5, maxval=1.0)
    model = make_moe(top_k=1, capacity_factor=1.0)  # C = ceil(1 * 1.0 * 8 / 4) = 2 slots per expert
    params = randomized(init_params(model, x))
    params["router"]["kernel"] = jnp.zeros((4, 4)).at[:, 0].set(1.0)  # every token picks expert 0
    y, stats = forward(model, params, x)
    np.testing.assert_allclose(stats["dropped_fraction"], (8 - 2) / 8)
    assert np.all(np.asarray(y[:, 2:]) == 0.0)  # dropped: exactly 0, the residual carries them
    np.testing.assert_allclose(y[:, :2], reference_moe(params, "gelu", 1, x)[:, :2], atol=1e-5, rtol=1e-5)


def test_slots_fill_token_by_token_so_earlier_tokens_keep_their_choices():
    # Tokens 0-3 choose experts (0, 1), tokens 4-7 choose (1, 0); capacity 4 per expert. Tokens 0-3
    # fill both experts with their two choices, so tokens 4-7 lose both (GShard's first-choices-first
    # order would instead keep every first choice and drop every second one).
    x = np.stack([routed(0, 1)] * 4 + [routed(1, 0)] * 4)[None].repeat(2, axis=0)
    x = x + 0.1 * np.asarray(jax.random.normal(jax.random.key(0), x.shape))  # distinct tokens, same ranking
    model = make_moe(top_k=2, capacity_factor=1.0)  # C = ceil(2 * 1.0 * 8 / 4) = 4
    params = randomized(init_params(model, x))
    params["router"]["kernel"] = jnp.eye(4)
    y, stats = forward(model, params, x)
    np.testing.assert_allclose(stats["dropped_fraction"], 0.5)
    np.testing.assert_allclose(stats["expert_fraction"], [0.5, 0.5, 0, 0])
    np.testing.assert_allclose(y[:, :4], reference_moe(params, "gelu", 2, x)[:, :4], atol=1e-5, rtol=1e-5)
    assert np.all(np.asarray(y[:, 4:]) == 0.0)


def test_capacity_keeps_the_layer_causal():
    x = jax.random.normal(jax.random.key(0), (2, 12, 4))
    model = make_moe(top_k=2, capacity_factor=0.5)  # C = 3 of 12 tokens: many drops
    params = randomized(init_params(model, x))
    y, stats = forward(model, params, x)
    assert stats["dropped_fraction"] > 0.3
    changed = x.at[:, 6:].set(jax.random.normal(jax.random.key(1), (2, 6, 4)))
    y_changed, _ = forward(model, params, changed)
    np.testing.assert_allclose(y[:, :6], y_changed[:, :6], atol=1e-6)  # earlier tokens never see later ones


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(num_experts=0, top_k=1), "at least 1 expert"),
        (dict(top_k=0), "top_k=0"),
        (dict(top_k=5), "top_k=5"),
        (dict(capacity_factor=0.0), "capacity_factor=0.0"),
    ],
)
def test_impossible_settings_are_rejected(settings, message):
    with pytest.raises(ValueError, match=message):
        make_moe(**settings).init(jax.random.key(0), jnp.zeros((1, 4, 8)))


def test_params_carry_logical_axes():
    model = make_moe(kind="swiglu")
    boxed = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((2, 8, 8)))["params"]
    specs = nn.get_partition_spec(boxed)
    assert specs["router"]["kernel"] == P("embed", None)
    for name in ("gate", "up"):
        assert specs[EXPERTS_NAME][name]["kernel"] == P("expert", "embed", "mlp")
        assert specs[EXPERTS_NAME][name]["bias"] == P("expert", "mlp")
    assert specs[EXPERTS_NAME]["down"]["kernel"] == P("expert", "mlp", "embed")
    assert boxed[EXPERTS_NAME]["up"]["kernel"].value.shape == (4, 8, 16)


def test_parameter_counts_total_and_active():
    model = make_moe(top_k=2)  # E=4, D=8, F=16, gelu with biases
    shapes = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((2, 8, 8)))["params"])
    router = 8 * 4
    per_expert = (8 * 16 + 16) + (16 * 8 + 8)
    assert parameter_counts(shapes, top_k=2) == (router + 4 * per_expert, router + 2 * per_expert)
    tree = {"embed": np.zeros((10, 8)), "block": {"moe": init_params(model, jnp.zeros((2, 8, 8)))}}
    assert parameter_counts(tree, top_k=1) == (80 + router + 4 * per_expert, 80 + router + per_expert)


class Nested(nn.Module):
    @nn.compact
    def __call__(self, x):
        return make_moe(top_k=2, capacity_factor=0.5, name="moe")(x)


class TwoMoeLayers(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = x + make_moe(top_k=1, capacity_factor=1.0, name="first")(x)
        return x + Nested(name="nested")(x)


def test_moe_objective_sums_losses_and_averages_metrics_over_layers():
    assert moe_objective({}, 0.01, 0.001) == (0.0, {})
    x = jax.random.normal(jax.random.key(0), (2, 8, 8))
    model = TwoMoeLayers()
    params = randomized(init_params(model, x))
    _, moe = model.apply({"params": params}, x, mutable=["moe"])
    (first,) = moe["moe"]["first"]["stats"]
    (second,) = moe["moe"]["nested"]["moe"]["stats"]
    loss, metrics = moe_objective(moe["moe"], 0.01, 0.001)
    expected = 0.01 * (first["load_balance_loss"] + second["load_balance_loss"]) + 0.001 * (
        first["router_z_loss"] + second["router_z_loss"]
    )
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    assert sorted(metrics) == sorted(
        ["moe_load_balance_loss", "moe_router_z_loss", "moe_dropped_fraction"]
        + [f"moe_expert_{e}_fraction" for e in range(4)]
    )
    for name in ("load_balance_loss", "router_z_loss", "dropped_fraction"):
        np.testing.assert_allclose(metrics[f"moe_{name}"], (first[name] + second[name]) / 2, rtol=1e-6)
    for e in range(4):
        mean = (first["expert_fraction"][e] + second["expert_fraction"][e]) / 2
        np.testing.assert_allclose(metrics[f"moe_expert_{e}_fraction"], mean, rtol=1e-6)
    assert all(m.shape == () for m in metrics.values())
    assert float(metrics["moe_dropped_fraction"]) > 0  # the small capacities do drop
    # Stats stacked by nn.scan (a leading layer axis) count one layer per entry.
    stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), first, second)
    stacked_loss, stacked_metrics = moe_objective({"blocks": {"stats": (stacked,)}}, 0.01, 0.001)
    np.testing.assert_allclose(stacked_loss, loss, rtol=1e-6)
    np.testing.assert_allclose(stacked_metrics["moe_expert_3_fraction"], metrics["moe_expert_3_fraction"])


def test_sharded_over_an_expert_mesh_matches_one_device():
    mesh = sharding.make_mesh({"data": 2, "fsdp": 1, "expert": 4, "tensor": 1})
    rules = sharding.logical_rules(MESH_RULES)
    model = make_moe(top_k=2, capacity_factor=1.0, kind="swiglu")
    x = jax.random.normal(jax.random.key(0), (8, 8, 8))  # the batch splits 8 ways: data x expert
    params = randomized(init_params(model, x), scale=0.3)

    def objective(params, x):
        y, moe = model.apply({"params": params}, x, mutable=["moe"])
        aux, metrics = moe_objective(moe["moe"], 0.01, 0.001)
        return jnp.mean(y**2) + aux, (y, metrics)

    value_and_grad = jax.value_and_grad(objective, has_aux=True)
    (loss, (y, metrics)), grads = jax.jit(value_and_grad)(params, x)
    assert np.abs(np.asarray(grads["router"]["kernel"])).max() > 0

    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        boxed = jax.eval_shape(model.init, jax.random.key(0), x)["params"]
        param_shardings = sharding.logical_shardings(boxed, mesh, rules)
        assert param_shardings[EXPERTS_NAME]["gate"]["kernel"].spec == P("expert", "fsdp", "tensor")
        assert param_shardings[EXPERTS_NAME]["down"]["kernel"].spec == P("expert", "tensor", "fsdp")
        sharded_params = jax.device_put(params, param_shardings)
        sharded_x = jax.device_put(x, sharding.batch_sharding(mesh))
        sharded_value_and_grad = jax.jit(value_and_grad).lower(sharded_params, sharded_x).compile()
        (loss_s, (y_s, metrics_s)), grads_s = sharded_value_and_grad(sharded_params, sharded_x)
        apply = jax.jit(lambda params, x: model.apply({"params": params}, x))
        forward_hlo = apply.lower(sharded_params, sharded_x).compile().as_text()

    # Expert parallel: the forward moves tokens to their experts and back with two all-to-alls, and
    # neither it nor the backward gathers tokens or expert weights onto every device.
    assert forward_hlo.count(" all-to-all(") == 2 and " all-gather(" not in forward_hlo
    assert " all-gather(" not in sharded_value_and_grad.as_text()

    assert grads_s[EXPERTS_NAME]["up"]["kernel"].sharding.spec[0] == "expert"
    np.testing.assert_allclose(y_s, y, atol=1e-5)
    np.testing.assert_allclose(loss_s, loss, atol=1e-5)
    for name in metrics:
        np.testing.assert_allclose(metrics_s[name], metrics[name], atol=1e-5)
    for g_s, g in zip(jax.tree.leaves(grads_s), jax.tree.leaves(grads), strict=True):
        np.testing.assert_allclose(g_s, g, atol=1e-5)
