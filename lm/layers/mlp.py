"""Position-wise feed-forward block."""

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm.layers.partitioning import constrain, param_init


class Mlp(nn.Module):
    """W2 gelu(W1 x): embed -> hidden -> embed."""

    hidden_dim: int
    use_bias: bool = True
    dtype: Any = jnp.float32
    kernel_init: Callable = nn.initializers.normal(0.02)
    out_kernel_init: Callable = nn.initializers.normal(0.02)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        embed_dim = x.shape[-1]
        h = nn.Dense(  # (B, T, D) -> (B, T, F)
            self.hidden_dim,
            use_bias=self.use_bias,
            dtype=self.dtype,
            kernel_init=param_init(self.kernel_init, ("embed", "mlp")),
            bias_init=param_init(nn.initializers.zeros, ("mlp",)),
            name="up",
        )(x)
        h = constrain(nn.gelu(h, approximate=True), ("batch", "length", "mlp"))
        return nn.Dense(  # (B, T, F) -> (B, T, D)
            embed_dim,
            use_bias=self.use_bias,
            dtype=self.dtype,
            kernel_init=param_init(self.out_kernel_init, ("mlp", "embed")),
            bias_init=param_init(nn.initializers.zeros, ("embed",)),
            name="down",
        )(h)
