"""Mixture-of-experts feed-forward layer (Switch Transformer / GShard style token-choice routing).

Each batch row is a routing group of S = T tokens. Per token, in float32:

    logits = x W_router (E values, no bias)     probs = softmax(logits)
    top_k experts by probability; gates:
        top_k == 1: the chosen expert's probability p_e (Switch: the router gets a gradient)
        top_k  > 1: the k chosen probabilities renormalised to sum to 1 (GShard, Mixtral)
    y = sum over the kept choices of gate * expert_e(x)

Each expert holds C = min(S, max(1, ceil(top_k * capacity_factor * S / E))) token slots per group
(an expert can be chosen at most once per token, so more than S slots would stay empty). Slots are
filled token by token in sequence order, each token's choices best first; a choice that finds its
expert full is dropped and contributes 0, so the token is carried only by the residual connection
around this layer. Whether a token is dropped thus depends only on itself and earlier tokens, so
the layer stays causal in a decoder. (GShard fills every first choice before any second choice,
which keeps more tokens but lets a later token's first choice evict an earlier token's second
choice: information flowing backwards in a causal model.) Decoding one token at a time (S = 1)
never drops, so outputs match training only where training dropped nothing.

Sown statistics (collection "moe", name "stats"), with N = the number of tokens in the batch:

    f_e = (number of (token, choice) assignments to expert e, before dropping) / (k N)   sum_e f_e = 1
    P_e = mean over tokens of probs[e]
    load_balance_loss = E * sum_e f_e P_e          (1 under perfectly uniform routing)
    router_z_loss = mean over tokens of logsumexp(logits)^2     (ST-MoE)
    dropped_fraction = dropped assignments / (k N)
    expert_fraction = f (E,)
lm/losses.py: moe_objective turns them into the auxiliary loss and metrics.
"""

import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm.layers.linear import Linear
from lm.layers.mlp import Mlp
from lm.layers.partitioning import constrain
from lm.losses import z_loss

EXPERTS_NAME = "experts"  # the vmapped expert Mlp; its params have a leading (E,) "expert" axis
# Two layouts of the expert inputs and outputs (E, G, C, D): split like the tokens (with the batch),
# and split by expert for the expert Mlps. Going from one to the other is an all-to-all.
TOKEN_LAYOUT = (None, "batch", None, "embed")
EXPERT_LAYOUT = ("expert", "batch", None, "embed")


def check_moe_settings(num_experts: int, top_k: int, capacity_factor: float) -> None:
    """Raises ValueError for settings no MoE layer can have."""
    if num_experts < 1:
        raise ValueError(f"num_experts={num_experts}: need at least 1 expert")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k={top_k}: each token picks between 1 and num_experts={num_experts} experts")
    if not capacity_factor > 0:
        raise ValueError(f"capacity_factor={capacity_factor}: must be > 0")


def expert_capacity(num_experts: int, top_k: int, capacity_factor: float, group_size: int) -> int:
    """Token slots per expert per group: ceil(k * capacity_factor * S / E), at least 1, at most S."""
    return min(group_size, max(1, math.ceil(top_k * capacity_factor * group_size / num_experts)))


def _mesh_axis_set(mesh_axes: str | tuple[str, ...] | None) -> set[str]:
    return set() if mesh_axes is None else {mesh_axes} if isinstance(mesh_axes, str) else set(mesh_axes)


def expert_parallel_rules() -> tuple[str | tuple[str, ...] | None, list[tuple]]:
    """(the mesh axes the logical "expert" axis maps to, the logical rules for inside one expert).

    The expert Mlp constrains its activations with logical names (batch, length, mlp) and nn.vmap
    adds the expert axis in front: spmd_axis_name puts that axis on the expert mesh axes, and inside
    the expert the rules that would reuse them (batch over data x fsdp x expert) are left out, as
    Flax leaves them out for the whole (E, G, C, D) array, so the groups stay split over the rest.
    """
    rules = list(nn.get_logical_axis_rules())
    expert_mesh_axes = nn.logical_to_mesh_axes(("expert",), rules)[0] if rules else None
    taken = _mesh_axis_set(expert_mesh_axes)
    return expert_mesh_axes, [(name, axes) for name, axes in rules if not _mesh_axis_set(axes) & taken]


class MoeMlp(nn.Module):
    """(B, T, D) -> (B, T, D): E expert Mlps of the given kind and hidden width, top_k of them per token.

    See the module docstring for the routing, gates, capacity and the sown statistics.
    """

    num_experts: int
    top_k: int
    capacity_factor: float
    kind: str
    hidden_dim: int
    use_bias: bool = True
    dtype: Any = jnp.float32
    kernel_init: Callable = nn.initializers.normal(0.02)
    out_kernel_init: Callable = nn.initializers.normal(0.02)
    router_init: Callable = nn.initializers.normal(0.02)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        check_moe_settings(self.num_experts, self.top_k, self.capacity_factor)
        num_groups, group_size, embed_dim = x.shape
        num_experts, top_k = self.num_experts, self.top_k
        capacity = expert_capacity(num_experts, top_k, self.capacity_factor, group_size)

        logits = Linear(  # (G, S, D) -> (G, S, E), float32
            (embed_dim,),
            (num_experts,),
            ("embed", None),
            use_bias=False,
            dtype=jnp.float32,
            kernel_init=self.router_init,
            name="router",
        )(x.astype(jnp.float32))
        probs = jax.nn.softmax(logits, axis=-1)  # (G, S, E)
        # Top k by repeated argmax (ties to the lower expert index); unlike lax.top_k, which XLA's
        # SPMD partitioner gathers onto every device, argmax stays split with the batch.
        choices, remaining = [], probs
        for _ in range(top_k):
            choice = jax.nn.one_hot(jnp.argmax(remaining, axis=-1), num_experts, dtype=jnp.int32)  # (G, S, E)
            choices.append(choice)
            remaining = jnp.where(choice, -1.0, remaining)
        expert_mask = jnp.stack(choices, axis=2)  # (G, S, K, E), best choice first
        assigned = expert_mask.astype(jnp.float32)
        top_probs = jnp.einsum("gse,gske->gsk", probs, assigned)  # (G, S, K)
        gates = top_probs if top_k == 1 else top_probs / jnp.sum(top_probs, axis=-1, keepdims=True)

        # Slot of each choice in its expert: the number of assignments to that expert before it, in
        # token-major order (token 0's choices, then token 1's, ...), so the layer stays causal.
        in_order = expert_mask.reshape(num_groups, group_size * top_k, num_experts)
        filled = jnp.cumsum(in_order, axis=1).reshape(expert_mask.shape)  # (G, S, K, E)
        position = jnp.sum((filled - 1) * expert_mask, axis=-1)  # (G, S, K)
        kept = position < capacity  # (G, S, K)
        slot = jax.nn.one_hot(position, capacity, dtype=jnp.float32)  # (G, S, K, C), all 0 where dropped
        dispatch = jnp.einsum("gske,gskc->gsec", assigned, slot)  # (G, S, E, C)
        combine = jnp.einsum("gsk,gske,gskc->gsec", gates, assigned, slot)  # (G, S, E, C)

        expert_fraction = jnp.mean(assigned, axis=(0, 1, 2))  # (E,) sums to 1
        mean_probs = jnp.mean(probs, axis=(0, 1))  # (E,)
        self.sow(
            "moe",
            "stats",
            {
                "load_balance_loss": num_experts * jnp.sum(expert_fraction * mean_probs),
                "router_z_loss": jnp.mean(z_loss(logits)),
                "dropped_fraction": 1.0 - jnp.mean(kept, dtype=jnp.float32),
                "expert_fraction": expert_fraction,
            },
        )

        # Dispatch and combine run where the tokens are; the layout changes move them to their experts and back.
        expert_in = jnp.einsum("gsec,gsd->egcd", dispatch.astype(self.dtype), x.astype(self.dtype))  # (E, G, C, D)
        expert_in = constrain(constrain(expert_in, TOKEN_LAYOUT), EXPERT_LAYOUT)
        expert_mesh_axes, rules_in_expert = expert_parallel_rules()
        experts = nn.vmap(  # expert e's Mlp on expert_in[e]; its params get a leading (E,) "expert" axis
            Mlp,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            spmd_axis_name=expert_mesh_axes,
            metadata_params={nn.PARTITION_NAME: "expert"},
        )(
            kind=self.kind,
            hidden_dim=self.hidden_dim,
            use_bias=self.use_bias,
            dtype=self.dtype,
            kernel_init=self.kernel_init,
            out_kernel_init=self.out_kernel_init,
            name=EXPERTS_NAME,
        )
        with nn.logical_axis_rules(rules_in_expert):
            expert_out = experts(expert_in)  # (E, G, C, D)
        expert_out = constrain(constrain(expert_out, EXPERT_LAYOUT), TOKEN_LAYOUT)
        return jnp.einsum("gsec,egcd->gsd", combine.astype(self.dtype), expert_out)  # (G, S, D)


def parameter_counts(params, top_k: int = 1) -> tuple[int, int]:
    """(total, active per token) parameter counts of an unboxed param tree (arrays or ShapeDtypeStructs):
    the one parameter counter (a dense model's two counts are equal).

    A leaf under a module named EXPERTS_NAME has a leading axis of E experts; a token uses top_k of them.
    """
    total = active = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        size = math.prod(leaf.shape)
        total += size
        if any(getattr(key, "key", None) == EXPERTS_NAME for key in path):
            active += size // leaf.shape[0] * top_k
        else:
            active += size
    return total, active
