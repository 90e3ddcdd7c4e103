"""Meshes from config sizes, and parameters really sharded the way the rules say."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from lm import sharding
from lm.cli.resolve import build_experiment
from lm.errors import UserError
from lm.layers.partitioning import constrain, take_rows
from lm.train.optim import make_optimizer, resolve_schedule
from lm.train.setup import abstract_state, state_builder


def test_mesh_shape_resolves_minus_one():
    assert sharding.mesh_shape({"data": -1, "fsdp": 2, "expert": 1, "tensor": 1}, 8) == (4, 2, 1, 1, 1)
    assert sharding.mesh_shape({"data": 2, "fsdp": 1, "expert": 2, "tensor": 2}, 8) == (2, 1, 2, 1, 2)
    assert sharding.mesh_shape({"data": 2, "context": -1}, 8) == (2, 1, 1, 4, 1)  # an axis left out is 1


@pytest.mark.parametrize(
    "sizes, message",
    [
        ({"data": 3, "fsdp": -1, "expert": 1, "tensor": 1}, "does not divide the 8 devices"),
        ({"data": 2, "fsdp": 2, "expert": 1, "tensor": 1}, "needs 4 devices but 8 are available"),
        ({"data": -1, "fsdp": -1, "expert": 1, "tensor": 1}, "at most one -1"),
    ],
)
def test_bad_meshes_are_user_errors(sizes, message):
    with pytest.raises(UserError, match=message):
        sharding.mesh_shape(sizes, 8)


def test_a_mesh_larger_than_the_cpu_devices_says_how_to_fake_them():
    fake = r"on a CPU, fake (\d+) devices: XLA_FLAGS=--xla_force_host_platform_device_count=\1 before the command"
    with pytest.raises(UserError, match=r"does not divide the 1 devices; " + fake) as error:
        sharding.make_mesh({"data": -1, "fsdp": 4, "expert": 1, "tensor": 1}, jax.devices()[:1])
    assert "count=4 " in str(error.value)
    with pytest.raises(UserError, match=r"needs 16 devices but 8 are available; .*; " + fake) as error:
        sharding.make_mesh({"data": 16, "fsdp": 1, "expert": 1, "tensor": 1})
    assert "count=16 " in str(error.value)
    with pytest.raises(UserError) as error:  # fewer than the devices: nothing to fake
        sharding.make_mesh({"data": 2, "fsdp": 1, "expert": 1, "tensor": 1})
    assert "fake" not in str(error.value)
    with pytest.raises(UserError) as error:  # an accelerator's devices cannot be faked
        sharding.mesh_shape({"data": 16, "fsdp": 1, "expert": 1, "tensor": 1}, 8, on_cpu=False)
    assert "fake" not in str(error.value)


def test_batch_must_divide_the_data_axes():
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "expert": 2, "tensor": 1})
    sharding.check_batch(16, 2, mesh)
    with pytest.raises(UserError, match="not divisible by the 8 batch shards"):
        sharding.check_batch(12, 1, mesh)
    with pytest.raises(UserError, match="not divisible by train.grad_accum_steps"):
        sharding.check_batch(16, 3, mesh)


def test_parameters_are_sharded_by_the_logical_rules(data_dir, test_config):
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "expert": 1, "tensor": 2})
    rules = sharding.logical_rules(test_config.sharding_rules)
    init = state_builder(build_experiment(test_config), make_optimizer(resolve_schedule(test_config).optimizer))
    shapes, shardings = abstract_state(init, jax.random.key(0), mesh, rules)
    params = shardings.params
    assert params["decoder"]["block_0"]["mlp"]["up"]["kernel"].spec == P("fsdp", "tensor")
    assert params["decoder"]["block_0"]["mlp"]["down"]["kernel"].spec == P("tensor", "fsdp")
    assert params["decoder"]["block_0"]["attention"]["query"]["kernel"].spec == P("fsdp", "tensor", None)
    assert params["token_embed"]["embedding"].spec == P("tensor", "fsdp")
    # Adam's moments are sharded like the parameters they track.
    adam_state = shardings.opt_state[1][0]
    assert adam_state.mu["decoder"]["block_0"]["mlp"]["up"]["kernel"].spec == P("fsdp", "tensor")
    assert shapes.params["token_embed"]["embedding"].shape == (64 * 2, 32)  # 65 chars padded to 128


def test_a_mesh_axis_that_does_not_divide_a_parameter_is_a_user_error(data_dir, test_config):
    test_config.model.moe.num_experts = 4
    mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "expert": 8, "tensor": 1})
    rules = sharding.logical_rules(test_config.sharding_rules)
    init = state_builder(build_experiment(test_config), make_optimizer(resolve_schedule(test_config).optimizer))
    with pytest.raises(UserError, match=r"a dimension of 4 cannot be split over mesh axes expert \(8 devices\)"):
        abstract_state(init, jax.random.key(0), mesh, rules)


@pytest.mark.parametrize("sizes", [{"data": 2, "fsdp": 4}, {"data": 2, "fsdp": 2, "tensor": 2}, {"fsdp": 8}])
def test_token_rows_reach_the_batch_layout_without_replicating_the_activations(sizes, capfd):
    """An FSDP-sharded table's rows (take_rows), then the activations' layout, forward and backward: the
    values are table[ids] and its scatter-add gradient, and XLA compiles it without gathering the whole
    batch of rows on every device (what it does when the gather's output goes to the batch layout
    directly with the batch over data x fsdp; with tensor too, it warns of it)."""
    mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "expert": 1, "tensor": 1, **sizes})
    batch, length, vocab, width = 16, 8, 64, 32
    rng = np.random.default_rng(0)
    table = rng.normal(size=(vocab, width)).astype(np.float32)
    ids = rng.integers(0, vocab, size=(batch, length)).astype(np.int32)
    weights = rng.normal(size=(batch, length, width)).astype(np.float32)

    def rows_and_grad(table, ids, weights):
        def loss(table):
            rows = constrain(take_rows(table, ids), ("batch", "length", "embed"))
            return jnp.sum(rows * weights), rows
        return jax.grad(loss, has_aux=True)(table)

    with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.DEFAULT_RULES):
        table_sharding, ids_sharding = sharding.logical_shardings(
            (nn.Partitioned(jax.ShapeDtypeStruct(table.shape, table.dtype), ("vocab", "embed")),
             nn.Partitioned(jax.ShapeDtypeStruct(ids.shape, ids.dtype), ("batch", "length"))),
            mesh, sharding.DEFAULT_RULES)
        args = (jax.device_put(table, table_sharding), jax.device_put(ids, ids_sharding), weights)
        capfd.readouterr()
        step = jax.jit(rows_and_grad).lower(*args).compile()
        grad, rows = step(*args)
    assert "Involuntary full rematerialization" not in capfd.readouterr().err
    whole_batch_of_rows = [line for line in step.as_text().splitlines()
                           if "all-gather(" in line and f"= f32[{batch}," in line]
    assert not whole_batch_of_rows
    np.testing.assert_array_equal(np.asarray(rows), table[ids])
    expected_grad = np.zeros_like(table)
    np.add.at(expected_grad, ids.reshape(-1), weights.reshape(-1, width))
    np.testing.assert_allclose(np.asarray(grad), expected_grad, rtol=1e-5, atol=1e-5)
