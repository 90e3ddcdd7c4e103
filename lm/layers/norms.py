"""Normalisation layers."""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm.layers.partitioning import param_init


class Norm(nn.Module):
    """LayerNorm over the last (embed) axis, with logically named scale and bias."""

    dtype: Any = jnp.float32
    epsilon: float = 1e-5

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return nn.LayerNorm(
            epsilon=self.epsilon,
            dtype=self.dtype,
            scale_init=param_init(nn.initializers.ones, ("embed",)),
            bias_init=param_init(nn.initializers.zeros, ("embed",)),
        )(x)
