"""Position-wise feed-forward block."""

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm.layers.linear import Linear
from lm.layers.partitioning import constrain


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
        h = Linear(  # (B, T, D) -> (B, T, F)
            (embed_dim,),
            (self.hidden_dim,),
            ("embed", "mlp"),
            use_bias=self.use_bias,
            dtype=self.dtype,
            kernel_init=self.kernel_init,
            name="up",
        )(x)
        h = constrain(nn.gelu(h, approximate=True), ("batch", "length", "mlp"))
        return Linear(  # (B, T, F) -> (B, T, D)
            (self.hidden_dim,),
            (embed_dim,),
            ("mlp", "embed"),
            use_bias=self.use_bias,
            dtype=self.dtype,
            kernel_init=self.out_kernel_init,
            name="down",
        )(h)
