"""Logical axis names on parameters and activations.

Parameters are created with `param_init(init, names)` so each one carries its logical axes;
activations go through `constrain(x, names)`. The rules table in the config maps the names
(batch, length, embed, heads, kv, mlp, vocab, expert) onto mesh axes; without rules in scope both
are no-ops.
"""

from collections.abc import Callable

import flax.linen as nn
import jax

LogicalAxes = tuple[str | None, ...]


def param_init(init: Callable, names: LogicalAxes) -> Callable:
    return nn.with_logical_partitioning(init, names)


def constrain(x: jax.Array, names: LogicalAxes) -> jax.Array:
    return nn.with_logical_constraint(x, names)
