"""A linear layer written as an einsum, with logically named kernel and bias axes."""

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm.layers.partitioning import LogicalAxes, param_init


class Einsum(nn.Module):
    """y = einsum(equation, x, kernel) + bias; the bias has the output's trailing kernel axes.

    e.g. query projection: equation "btd,dhk->bthk", kernel_shape (D, H, Dh),
    kernel_axes ("embed", "heads", "kv"), bias_axes ("heads", "kv").
    """

    equation: str
    kernel_shape: tuple[int, ...]
    kernel_axes: LogicalAxes
    bias_axes: LogicalAxes | None  # None: no bias
    dtype: Any = jnp.float32
    kernel_init: Callable = nn.initializers.normal(0.02)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.param(
            "kernel", param_init(self.kernel_init, self.kernel_axes), self.kernel_shape, jnp.float32
        )
        y = jnp.einsum(self.equation, x.astype(self.dtype), kernel.astype(self.dtype))
        if self.bias_axes is not None:
            bias_shape = self.kernel_shape[-len(self.bias_axes):]
            bias = self.param(
                "bias", param_init(nn.initializers.zeros, self.bias_axes), bias_shape, jnp.float32
            )
            y = y + bias.astype(self.dtype)
        return y
