"""LoRA: low-rank adapters beside the projections of a Transformer (Hu et al. 2021).

A projection y = W x + b that model.lora.targets names gets two parameters beside its kernel (Linear,
lm/layers/linear.py): lora_a (in..., r), initialised as torch's default Linear (peft's choice), and
lora_b (r, out...), zeros; the layer computes

    y = W x + b + (alpha / r) * B (A (dropout(x)))

so a fresh adapter leaves the model's outputs unchanged. A and B take the kernel's logical axis names on
their input and output axes (the rank axis is unsharded): they shard like the weight they adapt.
Training the adapters alone (the rest frozen, without gradients or optimizer state) is lm/train/optim.py's,
for any parameter tree holding them (has_adapters), and checkpoints of the adapters alone (the frozen base
saved once) lm/train/checkpoint.py's; peft folders in and out are lm/hf/peft.py's. docs/post-training.md
has the commands.
"""

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util

from lm.errors import UserError
from lm.layers.options import SHARE_BELOW_ONE, above, at_least, check_options, option
from lm.layers.partitioning import LogicalAxes, param_init

ATTENTION_TARGETS = ("query", "key", "value", "out")  # MultiHeadAttention's projections, self and cross
MLP_TARGETS = ("gate", "up", "down")  # the dense Mlp's (gate: SwiGLU only)
TARGETS = ATTENTION_TARGETS + MLP_TARGETS
ADAPTER_NAMES = ("lora_a", "lora_b")
# torch's default Linear init, which peft keeps for lora_A: kaiming_uniform(a=sqrt(5)), U(-1/sqrt(in), 1/sqrt(in))
A_INIT = nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform")


@dataclasses.dataclass(frozen=True)
class Adapter:
    """One projection's adapter: its rank, the update's scale (alpha / rank), the dropout on its input and
    whether that dropout is on (training)."""

    rank: int
    scale: float
    dropout: float
    train: bool


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """The LoRA options (config section model.lora)."""

    rank: int = option(0, "rank of the low-rank adapters; 0: none (docs/post-training.md)", bounds=at_least(0))
    alpha: float = option(16.0, "the adapters' update is scaled by alpha / rank", bounds=above(0))
    dropout: float = option(0.0, "dropout on the adapters' input, in training", bounds=SHARE_BELOW_ONE)
    targets: tuple = option(TARGETS, f"the projections adapted, by module name: {', '.join(ATTENTION_TARGETS)} of "
                                     f"every attention, {', '.join(MLP_TARGETS)} of every dense MLP")

    def __post_init__(self):
        check_options(self, "model.lora.")
        targets = self.targets
        if not isinstance(targets, tuple | list) or not all(isinstance(name, str) for name in targets):
            raise UserError(f"model.lora.targets={targets!r}: give a tuple of names from {', '.join(TARGETS)}, "
                            "e.g. --config.model.lora.targets=query,value")
        # a list from a config.json; --config.model.lora.targets=query,value gives ('query,value',)
        object.__setattr__(self, "targets", tuple(part.strip() for name in targets for part in name.split(",")))
        unknown = [name for name in self.targets if name not in TARGETS]
        if unknown:
            raise UserError(f"model.lora.targets: {', '.join(map(repr, unknown))} is no projection of lm's "
                            f"Transformer; the targets are {', '.join(TARGETS)}")

    def adapter(self, target: str, train: bool) -> Adapter | None:
        """The adapter of the projection named target; None where there is none (rank 0, not a target)."""
        if not self.rank or target not in self.targets:
            return None
        return Adapter(self.rank, self.alpha / self.rank, self.dropout, train)

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def check_matches(self, projections: tuple[str, ...]) -> None:
        """UserError when adapters are on and none of the targets is among the model's projections."""
        if self.rank and not set(self.targets) & set(projections):
            raise UserError(f"model.lora.targets={self.targets} match no projection of this model; its projections "
                            f"are {', '.join(projections)} (the LoRA targets: {', '.join(TARGETS)})")


def low_rank_update(module: nn.Module, x2d: jax.Array, adapter: Adapter, in_shape: tuple[int, ...],
                    out_shape: tuple[int, ...], kernel_axes: LogicalAxes, dtype: Any) -> jax.Array:
    """scale * B (A (dropout(x))): x2d (N, prod(in)) -> (N, prod(out)), creating module's lora_a (in..., r) and
    lora_b (r, out...) with the kernel's axis names on their in and out axes."""
    fan_in, fan_out, rank = math.prod(in_shape), math.prod(out_shape), adapter.rank

    def a_init(key, shape, dtype):
        return A_INIT(key, (fan_in, rank), dtype).reshape(shape)

    in_axes, out_axes = kernel_axes[: len(in_shape)], kernel_axes[len(in_shape):]
    a = module.param("lora_a", param_init(a_init, (*in_axes, None)), (*in_shape, rank), jnp.float32)
    b = module.param("lora_b", param_init(nn.initializers.zeros, (None, *out_axes)), (rank, *out_shape), jnp.float32)
    x2d = nn.Dropout(adapter.dropout, deterministic=not adapter.train)(x2d)
    h = x2d @ a.reshape(fan_in, rank).astype(dtype)  # (N, r)
    return (h @ b.reshape(rank, fan_out).astype(dtype)) * jnp.asarray(adapter.scale, dtype)


def is_adapter(path) -> bool:
    """Whether a tree path (of keys, or of names) leads to an adapter's parameter (boxed or not)."""
    return any(_key(k) in ADAPTER_NAMES for k in path)


def _key(k) -> str:
    return getattr(k, "key", k)


def has_adapters(params) -> bool:
    """Whether a parameter tree (or one shaped like it: gradients, boxed parameters) holds any adapter."""
    return any(is_adapter(path) for path, _ in jax.tree_util.tree_leaves_with_path(params))


def adapters_off(params: dict) -> dict:
    """params with every lora_b zero: the base model's outputs, the base weights shared (not copied)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, p: jnp.zeros_like(p) if any(_key(k) == "lora_b" for k in path) else p, params)


def merged(params: dict, scale: float) -> dict:
    """params (a nested dict of arrays) with every adapted kernel W replaced by W + scale * A B and the adapters
    dropped: a plain model's parameters with the same outputs (dropout aside). Stacked layers (a leading
    'layers' or 'expert' axis on all three) merge layer by layer."""
    flat = traverse_util.flatten_dict(params)
    out = {}
    for path, value in flat.items():
        if path[-1] in ADAPTER_NAMES:
            continue
        module = path[:-1]
        if path[-1] == "kernel" and module + ("lora_a",) in flat:
            value = value + scale * low_rank_product(flat[module + ("lora_a",)], flat[module + ("lora_b",)],
                                                     value.shape).astype(value.dtype)
        out[path] = value
    return traverse_util.unflatten_dict(out)


def low_rank_product(a: jax.Array, b: jax.Array, kernel_shape: tuple[int, ...]) -> jax.Array:
    """A B in the kernel's shape: a (lead..., in..., r), b (lead..., r, out...) -> (lead..., in..., out...), where
    lead are stacked axes all three share. numpy arrays stay numpy (a host-side merge compiles nothing)."""
    lead = a.ndim + b.ndim - 2 - len(kernel_shape)
    stacked, rank = a.shape[:lead], a.shape[-1]
    return (a.reshape(*stacked, -1, rank) @ b.reshape(*stacked, rank, -1)).reshape(kernel_shape)
