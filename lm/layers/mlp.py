"""Position-wise feed-forward blocks: classic (GELU or ReLU) and SwiGLU.

  gelu        GELU with the tanh approximation (GPT-2, Hugging Face "gelu_new")
  gelu_exact  GELU with the exact erf (BERT, ViT; Hugging Face "gelu")
"""

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm.layers.linear import Linear
from lm.layers.lora import LoraConfig
from lm.layers.partitioning import constrain

MLP_KINDS = ("gelu", "gelu_exact", "relu", "swiglu")
ACTIVATIONS = {
    "gelu": lambda h: nn.gelu(h, approximate=True),
    "gelu_exact": lambda h: nn.gelu(h, approximate=False),
    "relu": nn.relu,
}


def mlp_hidden_dim(kind: str, embed_dim: int, mlp_ratio: float, multiple: int, explicit: int = 0) -> int:
    """The hidden width: explicit when given (> 0, e.g. a pretrained model's intermediate size); else
    mlp_ratio * D for the classic MLP; for SwiGLU, which has three matrices instead of two, 2/3 of
    that (8D/3 at ratio 4) rounded to the nearest multiple, so both have about the same parameter
    count (within 1% when the multiple is small next to the width)."""
    if explicit > 0:
        return explicit
    classic = round(mlp_ratio * embed_dim)
    if kind != "swiglu":
        return classic
    return max(multiple, multiple * round(2 * classic / 3 / multiple))


class Mlp(nn.Module):
    """classic: W_down act(W_up x); swiglu: W_down (silu(W_gate x) * W_up x). embed -> hidden -> embed.
    lora: the LoRA adapters of gate, up and down that its targets name (train: their dropout is on)."""

    kind: str
    hidden_dim: int
    use_bias: bool = True
    dtype: Any = jnp.float32
    kernel_init: Callable = nn.initializers.normal(0.02)
    out_kernel_init: Callable = nn.initializers.normal(0.02)
    lora: LoraConfig = LoraConfig()
    train: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        if self.kind not in MLP_KINDS:
            raise ValueError(f"MLP kind {self.kind!r}: use one of {MLP_KINDS}")
        embed_dim = x.shape[-1]

        def project_in(name: str) -> jax.Array:  # (..., D) -> (..., F)
            return Linear(
                (embed_dim,),
                (self.hidden_dim,),
                ("embed", "mlp"),
                use_bias=self.use_bias,
                dtype=self.dtype,
                kernel_init=self.kernel_init,
                adapter=self.lora.adapter(name, self.train),
                name=name,
            )(x)

        if self.kind == "swiglu":
            h = nn.silu(project_in("gate")) * project_in("up")
        else:
            h = ACTIVATIONS[self.kind](project_in("up"))
        h = constrain(h, ("batch", "length", "mlp")[-h.ndim :])
        return Linear(  # (..., F) -> (..., D)
            (self.hidden_dim,),
            (embed_dim,),
            ("mlp", "embed"),
            use_bias=self.use_bias,
            dtype=self.dtype,
            kernel_init=self.out_kernel_init,
            adapter=self.lora.adapter("down", self.train),
            name="down",
        )(h)
