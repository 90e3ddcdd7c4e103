"""Meshes from config sizes, and parameters really sharded the way the rules say."""

import jax
import pytest
from jax.sharding import PartitionSpec as P

from lm import sharding
from lm.errors import UserError
from lm.train.optim import make_optimizer
from lm.train.setup import abstract_state, load_experiment, state_builder


def test_mesh_shape_resolves_minus_one():
    assert sharding.mesh_shape({"data": -1, "fsdp": 2, "expert": 1, "tensor": 1}, 8) == (4, 2, 1, 1)
    assert sharding.mesh_shape({"data": 2, "fsdp": 1, "expert": 2, "tensor": 2}, 8) == (2, 1, 2, 2)


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
    init = state_builder(load_experiment(test_config), make_optimizer(test_config.optimizer))
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
    init = state_builder(load_experiment(test_config), make_optimizer(test_config.optimizer))
    with pytest.raises(UserError, match=r"a dimension of 4 cannot be split over mesh axes expert \(8 devices\)"):
        abstract_state(init, jax.random.key(0), mesh, rules)
