"""Normalisation over the last (embed) axis: LayerNorm or RMSNorm."""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm.layers.partitioning import param_init

NORM_KINDS = ("layer", "rms")


class Norm(nn.Module):
    """layer: (x - mean) / sqrt(var + eps) * g + b.  rms: x / sqrt(mean(x^2) + eps) * g (no bias, no centring).

    Statistics are computed in float32 whatever the compute dtype.
    """

    kind: str = "layer"
    dtype: Any = jnp.float32
    epsilon: float = 1e-5

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale_init = param_init(nn.initializers.ones, ("embed",))
        if self.kind == "layer":
            bias_init = param_init(nn.initializers.zeros, ("embed",))
            return nn.LayerNorm(epsilon=self.epsilon, dtype=self.dtype, scale_init=scale_init, bias_init=bias_init)(x)
        if self.kind == "rms":
            return nn.RMSNorm(epsilon=self.epsilon, dtype=self.dtype, scale_init=scale_init)(x)
        raise ValueError(f"norm kind {self.kind!r}: use one of {NORM_KINDS}")
