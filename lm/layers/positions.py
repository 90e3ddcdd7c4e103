"""Position information: tables added to the embeddings, or applied inside attention.

Added to the token embeddings (B, T, D):
  sinusoidal  PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(p / 10000^(2i/D))  (Vaswani et al.)
  learned     a trained (max_length, D) table (GPT-2); cannot go past max_length
  sincos_2d   for an image grid of patches: half the channels encode the row, half the column,
              each as [sin(p w_i), cos(p w_i)] with w_i = 1 / 10000^(i / (D/4))  (MAE, big_vision)
Inside attention:
  rope        rotate each (x_i, x_{i+Dh/2}) pair of query and key channels by angle p * theta_i,
              theta_i = base^(-2i/Dh), so q.k depends on positions only through their offset
              (Su et al., RoFormer; the split-half layout of GPT-NeoX and LLaMA); RopeScaling stretches
              the theta_i for a context longer than the one trained on (linear, NTK, YaRN, Llama 3.1)
  alibi       no embedding; head h adds -m_h * (query position - key position) to its scores,
              slopes m_h from the geometric sequence of Press et al. (|offset| when not causal)
  none        nothing (a causal model can still infer position from its mask)
Everything but `learned` is a function of the position, so it extends to sequences longer than
the ones trained on.
"""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lm.layers.partitioning import param_init

EMBEDDING_KINDS = ("none", "sinusoidal", "learned")  # added to the token embeddings
ATTENTION_KINDS = ("rope", "alibi")  # applied inside attention
POSITION_KINDS = EMBEDDING_KINDS + ATTENTION_KINDS
ROPE_SCALINGS = ("none", "linear", "ntk", "yarn", "llama3")


def sinusoidal_table(positions: jax.Array, dim: int) -> jax.Array:
    """positions (T,) or (B, T) -> (..., T, dim), interleaved sin/cos as in the paper (dim even)."""
    inv_freq = 1.0 / 10000 ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)  # (dim/2,)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # (..., T, dim/2)
    return jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(*positions.shape, dim)


def sincos_2d_table(height: int, width: int, dim: int) -> jax.Array:
    """(height * width, dim) for a row-major grid of patches (dim divisible by 4)."""
    if dim % 4:
        raise ValueError(f"2-D sin-cos positions need a width divisible by 4, got {dim}")
    omega = 1.0 / 10000 ** (jnp.arange(dim // 4, dtype=jnp.float32) / (dim // 4))  # (dim/4,)
    rows, cols = jnp.meshgrid(jnp.arange(height), jnp.arange(width), indexing="ij")  # (H, W) each

    def encode(coordinate):  # (H, W) -> (H * W, dim/2)
        angles = coordinate.reshape(-1, 1).astype(jnp.float32) * omega[None]
        return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)

    return jnp.concatenate([encode(rows), encode(cols)], axis=-1)


class PositionEmbedding(nn.Module):
    """positions (T,) or per row (B, T) -> (..., T, D) to add to the token embeddings; zeros for
    none/rope/alibi."""

    kind: str
    max_length: int
    embed_dim: int
    embedding_init: nn.initializers.Initializer = nn.initializers.normal(0.02)

    @nn.compact
    def __call__(self, positions: jax.Array) -> jax.Array:
        if self.kind == "learned":
            if positions.shape[-1] > self.max_length:  # nn.Embed would silently clamp the indices
                raise ValueError(
                    f"learned positions cover {self.max_length} tokens, got a sequence of {positions.shape[-1]}; "
                    "use sinusoidal, rope or alibi positions to go past the training length"
                )
            table = self.param("embedding", param_init(self.embedding_init, (None, "embed")),
                               (self.max_length, self.embed_dim), jnp.float32)
            return jnp.take(table, positions, axis=0)
        if self.kind == "sinusoidal":
            return sinusoidal_table(positions, self.embed_dim)
        if self.kind in ("none",) + ATTENTION_KINDS:
            return jnp.zeros((*positions.shape, self.embed_dim), jnp.float32)
        raise ValueError(f"position kind {self.kind!r}: use one of {POSITION_KINDS}")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """How RoPE's frequencies theta_i = base^(-2i/Dh) are stretched for a context `factor` times longer than
    the one trained on (the model.rope_* options); each kind as transformers' ROPE_INIT_FUNCTIONS computes it:

      none    theta_i as they are
      linear  theta_i / factor: positions interpolated, p -> p / factor (Chen et al. 2023)
      ntk     the NTK-aware base change base -> base * factor^(Dh/(Dh-2)): the fastest channel keeps its
              frequency, the slowest is divided by factor. The base is fixed; transformers' 'dynamic' type
              instead grows it with each call's sequence length, which no fixed RoPE reproduces
      yarn    each channel between theta_i (extrapolated) and theta_i / factor (interpolated) by the turns
              r = original_context theta_i / (2 pi) it makes over the original context: channels past
              beta_fast turns keep theta_i, those under beta_slow take theta_i / factor, a linear ramp over
              the channel index between (its ends rounded outwards to whole channels with truncate); cos and
              sin are multiplied by attention_factor (0: 0.1 ln(factor) + 1), so the scores by its square
              (Peng et al. 2023, YaRN)
      llama3  by wavelength w_i = 2 pi / theta_i: w_i < original_context / high_freq_factor keeps theta_i,
              w_i > original_context / low_freq_factor takes theta_i / factor, and between them
              (1 - s) theta_i / factor + s theta_i with s = (original_context / w_i - low_freq_factor) /
              (high_freq_factor - low_freq_factor) (Llama 3.1)
    """

    kind: str = "none"
    factor: float = 1.0
    original_context: int = 0  # the context length trained on (yarn, llama3)
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0
    attention_factor: float = 0.0
    truncate: bool = True
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0


def ntk_base(base: float, head_dim: int, factor: float) -> float:
    """The NTK-aware base: base * factor^(Dh/(Dh-2))."""
    return base * factor ** (head_dim / (head_dim - 2))


def yarn_attention_factor(scaling: RopeScaling) -> float:
    """What YaRN multiplies cos and sin by: attention_factor where given, else 0.1 ln(factor) + 1 (1 for factor 1)."""
    if scaling.attention_factor:
        return scaling.attention_factor
    return 0.1 * math.log(scaling.factor) + 1.0 if scaling.factor > 1 else 1.0


def rope_frequencies(head_dim: int, base: float, scaling: RopeScaling = RopeScaling()) -> tuple[np.ndarray, float]:
    """(theta (Dh/2,) float32, the factor cos and sin are multiplied by): RoPE's frequencies over head_dim
    channels, stretched as `scaling` says (computed in float64 from the formulas of RopeScaling)."""
    kind, factor = scaling.kind, scaling.factor
    if kind not in ROPE_SCALINGS:
        raise ValueError(f"RoPE scaling {kind!r}: use one of {ROPE_SCALINGS}")
    if kind == "ntk":
        base = ntk_base(base, head_dim, factor)
    theta = base ** -(np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)  # (Dh/2,)
    magnitude = 1.0
    if kind == "linear":
        theta = theta / factor
    elif kind == "yarn":
        def channel(turns: float) -> float:  # the (fractional) channel index that turns this often
            return head_dim * math.log(scaling.original_context / (turns * 2 * math.pi)) / (2 * math.log(base))

        low, high = channel(scaling.beta_fast), channel(scaling.beta_slow)
        if scaling.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, head_dim - 1)
        if low == high:  # (as transformers: no zero-width ramp)
            high += 0.001
        interpolated = np.clip((np.arange(head_dim // 2) - low) / (high - low), 0, 1)  # 0: theta_i, 1: / factor
        theta = theta * (1 - interpolated) + theta / factor * interpolated
        magnitude = yarn_attention_factor(scaling)
    elif kind == "llama3":
        wavelength, context = 2 * math.pi / theta, scaling.original_context
        low, high = scaling.low_freq_factor, scaling.high_freq_factor
        mix = (context / wavelength - low) / (high - low)
        theta = np.where(wavelength < context / high, theta,
                         np.where(wavelength > context / low, theta / factor, (1 - mix) * theta / factor + mix * theta))
    return theta.astype(np.float32), magnitude


def apply_rope(x: jax.Array, positions: jax.Array, base: float = 10000.0,
               scaling: RopeScaling = RopeScaling()) -> jax.Array:
    """x (B, T, H, Dh), positions (T,) or per row (B, T) -> x with channel pairs (i, i + Dh/2) rotated
    by p * theta_i (theta_i as `scaling` stretches them; YaRN also scales the result)."""
    head_dim = x.shape[-1]
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head dimension, got {head_dim}")
    theta, magnitude = rope_frequencies(head_dim, base, scaling)  # (Dh/2,)
    angles = positions.astype(jnp.float32)[..., None] * theta  # (..., T, Dh/2)
    cos = (jnp.cos(angles) * magnitude)[..., None, :]  # (..., T, 1, Dh/2): broadcast over the heads (and rows)
    sin = (jnp.sin(angles) * magnitude)[..., None, :]
    first, second = jnp.split(x.astype(jnp.float32), 2, axis=-1)  # (B, T, H, Dh/2) each
    rotated = jnp.concatenate([first * cos - second * sin, first * sin + second * cos], axis=-1)
    return rotated.astype(x.dtype)


def alibi_slopes(num_heads: int) -> np.ndarray:
    """(H,) slopes: 2^(-8/n), 2^(-16/n), ... for n = H a power of two; otherwise those of the
    nearest lower power of two followed by every other slope of twice that many heads."""

    def geometric(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    lower = 2 ** math.floor(math.log2(num_heads))
    slopes = geometric(lower) + geometric(2 * lower)[0::2][: num_heads - lower]
    return np.asarray(slopes, np.float32)


def alibi_bias(num_heads: int, query_positions: jax.Array, key_positions: jax.Array, causal: bool) -> jax.Array:
    """Positions (T,), (S,) -> (1, H, T, S), or per row (B, T), (B, S) -> (B, H, T, S): additive scores
    -m_h (q - k), or -m_h |q - k| for bidirectional attention."""
    offset = query_positions[..., :, None] - key_positions[..., None, :]  # (..., T, S)
    distance = (offset if causal else jnp.abs(offset)).reshape(-1, 1, *offset.shape[-2:])  # (1 or B, 1, T, S)
    return -jnp.asarray(alibi_slopes(num_heads))[None, :, None, None] * distance.astype(jnp.float32)
