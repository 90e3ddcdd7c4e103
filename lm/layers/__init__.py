"""Small Linen building blocks shared by every model family."""

from lm.layers.attention import MultiHeadAttention
from lm.layers.mlp import Mlp
from lm.layers.norms import Norm
from lm.layers.partitioning import constrain, param_init

__all__ = ["MultiHeadAttention", "Mlp", "Norm", "constrain", "param_init"]
