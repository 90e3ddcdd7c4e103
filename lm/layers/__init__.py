"""Small Linen building blocks shared by every model family."""

from lm.layers.attention import MultiHeadAttention
from lm.layers.linear import Linear
from lm.layers.mlp import Mlp
from lm.layers.norms import Norm
from lm.layers.partitioning import constrain, param_init

__all__ = ["Linear", "MultiHeadAttention", "Mlp", "Norm", "constrain", "param_init"]
