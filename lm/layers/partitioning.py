"""Logical axis names on parameters and activations.

Parameters are created with `param_init(init, names)` so each one carries its logical axes;
activations go through `constrain(x, names)`. The rules table in the config maps the names
(batch, length, embed, heads, kv, mlp, vocab, expert) onto mesh axes; without rules in scope both
are no-ops.
"""

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from lm.sharding import spec_axes

LogicalAxes = tuple[str | None, ...]


def param_init(init: Callable, names: LogicalAxes) -> Callable:
    return nn.with_logical_partitioning(init, names)


def constrain(x: jax.Array, names: LogicalAxes) -> jax.Array:
    return nn.with_logical_constraint(x, names)


def mesh_axes(names: LogicalAxes) -> tuple[tuple[str, ...], ...]:
    """The mesh axes each logical name maps to under the rules in scope, a tuple per name."""
    return tuple(spec_axes(entry) for entry in nn.logical_to_mesh_axes(names))


def take_rows(table: jax.Array, ids: jax.Array) -> jax.Array:
    """table (V, D) with logical axes (vocab, embed), ids (B, ...) -> table[ids] (B, ..., D), split over
    the batch's mesh axes that the table's D does not use, D still split.

    Under FSDP the table's D is split over a mesh axis the batch also uses ('fsdp'). The gather's rows
    come out with D split and the batch whole; asked to go from there straight to the activations'
    layout (the batch split over every batch axis), XLA's SPMD partitioner replicates the whole
    (B, ..., D) on every device whenever the batch spans another mesh axis too (data x fsdp: an
    "involuntary full rematerialization", forward and backward). From this intermediate layout the step
    to the activations' is one all-to-all over the shared axes."""
    rows = jnp.take(table, ids, axis=0)
    if not nn.get_logical_axis_rules() or jax.sharding.get_abstract_mesh().empty:
        return rows
    _, embed_axes = mesh_axes(("vocab", "embed"))
    (batch_axes,) = mesh_axes(("batch",))
    free_batch_axes = tuple(axis for axis in batch_axes if axis not in embed_axes)
    return jax.lax.with_sharding_constraint(
        rows, PartitionSpec(free_batch_axes or None, *[None] * (ids.ndim - 1), embed_axes or None))
