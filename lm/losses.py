"""Losses and the metrics beside them, written once for every experiment.

Per position (the caller averages over what counts with `masked_mean`):
  cross_entropy(logits (..., V), targets)   -sum_v t_v log softmax(logits)_v, for integer targets (...)
                                            (t one-hot) or soft targets (..., V) (rows summing to 1);
                                            label smoothing s: t -> (1 - s) t + s / V
  z_loss(logits (..., V))                   logsumexp(logits)^2 (PaLM's output z-loss, ST-MoE's router z-loss)
  cross_entropy_and_logsumexp(logits,       {"cross_entropy", "logsumexp"}: the loss of integer targets and the
                              targets)      log-partition it subtracts from (a z-loss's, the logits' scale)
Means over a batch:
  masked_mean(values, weights)              sum(values * weights) / max(sum(weights), 1)
  masked_cross_entropy, masked_accuracy     the two above, weighted (weights: 1 for real tokens or rows)
  mean_squared_error(predictions, targets)  weighted mean of (prediction - target)^2 (regression heads)
  moe_objective(moe collection, ...)        the mixture-of-experts auxiliary loss and its metrics
Per preference pair:
  dpo_loss(policy and reference sequence    -log sigmoid(beta ((pi_c - ref_c) - (pi_r - ref_r))) and the implicit
           log-probabilities, beta)         rewards beta (pi - ref) of the chosen and rejected responses
Online RL, the GRPO family (as TRL's GRPOTrainer computes it):
  group_advantages(rewards (N,), G, scale)  reward - its group's mean (/ (the group's unbiased std + 1e-4))
  k3_kl(logprobs, ref_logprobs)             per token exp(ref - logp) - (ref - logp) - 1
  policy_loss(logprobs, old, ref, A, mask,  per token -min(ratio A, clip(ratio) A) + kl_beta k3, averaged as
              loss_type, ...)               loss_type says (RL_LOSSES: grpo, dr_grpo, dapo); clip and KL metrics
"""

import jax
import jax.numpy as jnp


def masked_mean(values: jax.Array, weights: jax.Array) -> jax.Array:
    """sum(values * weights) / max(sum(weights), 1): with 0/1 weights (same shape as values) the mean
    over the positions that count (real tokens, valid rows), for losses and metrics of padded batches;
    all-zero weights give 0."""
    weights = weights.astype(jnp.float32)
    return jnp.sum(values * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def smooth_targets(targets: jax.Array, label_smoothing: float) -> jax.Array:
    """(..., V) target distributions -> (1 - s) targets + s / V (Szegedy et al. 2016)."""
    return (1.0 - label_smoothing) * targets + label_smoothing / targets.shape[-1]


def cross_entropy(logits: jax.Array, targets: jax.Array, label_smoothing: float = 0.0) -> jax.Array:
    """logits (..., V) float32; targets: integer ids (...) or soft targets (..., V) -> (...).

    -sum_v t_v log softmax(logits)_v, with t the (smoothed) one-hot of an id or the given distribution.
    Integer targets without smoothing take logsumexp(logits) - logits[target], which never builds
    the (..., V) one-hot.
    """
    if targets.ndim == logits.ndim - 1:
        if not label_smoothing:
            return cross_entropy_and_logsumexp(logits, targets)["cross_entropy"]
        targets = jax.nn.one_hot(targets, logits.shape[-1])
    elif targets.shape != logits.shape:
        raise ValueError(f"targets {targets.shape} are neither ids for logits {logits.shape} nor distributions")
    if label_smoothing:
        targets = smooth_targets(targets, label_smoothing)
    return -(targets * jax.nn.log_softmax(logits, axis=-1)).sum(axis=-1)


def masked_cross_entropy(logits: jax.Array, targets: jax.Array, weights: jax.Array,
                         label_smoothing: float = 0.0) -> jax.Array:
    """The weighted mean of cross_entropy over positions: logits (..., V), targets (...) or (..., V),
    weights (...) -> ()."""
    return masked_mean(cross_entropy(logits, targets, label_smoothing), weights)


def masked_accuracy(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> jax.Array:
    """The weighted fraction of positions whose argmax is the label: (..., V), (...), (...) -> ()."""
    return masked_mean((jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32), weights)


def z_loss(logits: jax.Array) -> jax.Array:
    """logits (..., V) -> logsumexp(logits)^2 (...): pulls the softmax normaliser towards 1."""
    return jax.nn.logsumexp(logits, axis=-1) ** 2


def cross_entropy_and_logsumexp(logits: jax.Array, targets: jax.Array) -> dict[str, jax.Array]:
    """logits (..., V), integer targets (...) -> {"cross_entropy": logsumexp - logits[target], "logsumexp":
    logsumexp(logits)}, each (...): one logsumexp serves the loss and a z-loss (logsumexp^2)."""
    logsumexp = jax.nn.logsumexp(logits, axis=-1)
    target_logits = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return {"cross_entropy": logsumexp - target_logits, "logsumexp": logsumexp}


def mean_squared_error(predictions: jax.Array, targets: jax.Array, weights: jax.Array | None = None) -> jax.Array:
    """The (weighted) mean of (predictions - targets)^2 over every position: same shapes -> ()."""
    squared = jnp.square(predictions.astype(jnp.float32) - targets.astype(jnp.float32))
    return jnp.mean(squared) if weights is None else masked_mean(squared, weights)


def moe_objective(
    moe_collection, load_balance_weight: float, router_z_weight: float
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The auxiliary loss and metrics from the "moe" collection of model.apply(..., mutable=["moe"])
    (the statistics lm/layers/moe.py sows).

    loss = load_balance_weight * sum over MoE layers of load_balance_loss
         + router_z_weight * sum over MoE layers of router_z_loss
    Summed over layers, as in Switch Transformer and ST-MoE, so their weights (1e-2, 1e-3) carry
    over. Metrics are means over layers: moe_load_balance_loss, moe_router_z_loss,
    moe_dropped_fraction and moe_expert_{e}_fraction. Stats stacked with a leading layer axis (by
    nn.scan) count as one layer per entry. No MoE layers (an empty collection): (0.0, {}).
    """
    stats = jax.tree.leaves(moe_collection, is_leaf=lambda node: isinstance(node, dict) and "router_z_loss" in node)
    if not stats:
        return jnp.zeros((), jnp.float32), {}
    num_experts = stats[0]["expert_fraction"].shape[-1]

    def per_layer(name: str, *trailing: int) -> jax.Array:  # (L, *trailing)
        return jnp.concatenate([jnp.reshape(s[name], (-1, *trailing)) for s in stats])

    load_balance, router_z = per_layer("load_balance_loss"), per_layer("router_z_loss")
    loss = load_balance_weight * jnp.sum(load_balance) + router_z_weight * jnp.sum(router_z)
    metrics = {
        "moe_load_balance_loss": jnp.mean(load_balance),
        "moe_router_z_loss": jnp.mean(router_z),
        "moe_dropped_fraction": jnp.mean(per_layer("dropped_fraction")),
    }
    for e, fraction in enumerate(jnp.mean(per_layer("expert_fraction", num_experts), axis=0)):
        metrics[f"moe_expert_{e}_fraction"] = fraction
    return loss, metrics


def dpo_loss(policy_chosen: jax.Array, policy_rejected: jax.Array, reference_chosen: jax.Array,
             reference_rejected: jax.Array, beta: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Direct preference optimisation (Rafailov et al. 2023), TRL's sigmoid loss: from the summed log-probabilities
    (B,) of each pair's chosen and rejected responses under the policy and the frozen reference, (losses (B,),
    chosen rewards (B,), rejected rewards (B,)). loss = -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)));
    a response's reward is beta * (pi - ref), without gradient (for the metrics: accuracy, margins)."""
    chosen, rejected = policy_chosen - reference_chosen, policy_rejected - reference_rejected
    losses = -jax.nn.log_sigmoid(beta * (chosen - rejected))
    return losses, beta * jax.lax.stop_gradient(chosen), beta * jax.lax.stop_gradient(rejected)


RL_LOSSES = ("grpo", "dr_grpo", "dapo")  # policy_loss's loss types: how the per-token losses are averaged


def group_advantages(rewards: jax.Array, group_size: int, scale_by_std: bool) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GRPO's group-relative advantages, as TRL's GRPOTrainer computes them (scale_rewards "group", or "none"
    without scale_by_std): rewards (N,), N = prompts x group_size with a prompt's completions contiguous (rows
    p G .. p G + G - 1) -> (advantages (N,), metrics).

    advantage = reward - the mean of its group, divided by (the group's standard deviation + 1e-4) when
    scale_by_std. The standard deviation is the unbiased one (Bessel's correction, torch's .std()); a group of one
    has standard deviation 0 (so advantage 0). Metrics, as TRL logs them: reward (the mean), reward_std (unbiased,
    over the batch) and frac_reward_zero_std (the share of groups whose rewards are all equal: no learning signal).
    """
    if rewards.ndim != 1 or rewards.shape[0] % group_size:
        raise ValueError(f"rewards {rewards.shape} are not groups of {group_size} completions")
    rewards = rewards.astype(jnp.float32)
    groups = rewards.reshape(-1, group_size)  # (P, G)
    advantages = groups - groups.mean(axis=1, keepdims=True)  # (P, G)
    std = jnp.std(groups, axis=1, ddof=1, keepdims=True) if group_size > 1 else jnp.zeros_like(groups[:, :1])  # (P, 1)
    if scale_by_std:
        advantages = advantages / (std + 1e-4)
    metrics = {"reward": jnp.mean(rewards), "reward_std": jnp.std(rewards, ddof=1),
               "frac_reward_zero_std": jnp.mean(jnp.isclose(std, 0.0).astype(jnp.float32))}
    return advantages.reshape(-1), metrics


def k3_kl(logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
    """Per-token estimate of KL(policy || reference) from tokens the policy sampled (Schulman's k3, TRL's
    per_token_kl): log-probabilities (...) under the policy and the reference -> exp(ref - logp) - (ref - logp) - 1
    (...); >= 0, and 0 where the two agree."""
    delta = ref_logprobs - logprobs
    return jnp.exp(delta) - delta - 1.0


def policy_loss(logprobs: jax.Array, old_logprobs: jax.Array | None, ref_logprobs: jax.Array | None,
                advantages: jax.Array, mask: jax.Array, loss_type: str, clip_low: float, clip_high: float,
                kl_beta: float, max_completion_length: int, *,
                kl_importance_weighted: bool = False) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The clipped policy-gradient loss of the GRPO family, as TRL's GRPOTrainer computes it (token-level
    importance sampling): (loss (), metrics).

    logprobs, old_logprobs, ref_logprobs (N, T): per-token log-probabilities of the completion tokens under the
    policy being trained, the policy that sampled them (None: the policy itself without gradient, one update per
    batch of samples) and the frozen reference (None when kl_beta == 0); advantages (N,); mask (N, T), 1 on
    completion tokens. Per token, with ratio = exp(logp - old):
        loss = -min(ratio A, clip(ratio, 1 - clip_low, 1 + clip_high) A) + kl_beta k3_kl(logp, ref)
    (kl_importance_weighted: the KL term times ratio, TRL's use_bias_correction_kl, on by default in TRL 1.16).
    loss_type (RL_LOSSES) averages them:
        grpo     the mean over each sequence's tokens, then over sequences (all-masked rows count as 0)
        dr_grpo  the sum over tokens / (N max_completion_length)
        dapo     the sum over tokens / the number of completion tokens in the batch (TRL's dapo and bnpo on one
                 process without gradient accumulation: pass the whole batch of samples, not a slice of it)
    Metrics, token means over the mask as TRL logs them: clip_ratio_low (ratio < 1 - clip_low with A < 0),
    clip_ratio_high (ratio > 1 + clip_high with A > 0), clip_ratio_region (either), clip_ratio_low_min and
    clip_ratio_high_max (the extremes of the per-sequence fractions, over sequences with tokens) and, given
    ref_logprobs, kl (the mean KL term over completion tokens, before kl_beta).
    """
    if loss_type not in RL_LOSSES:
        raise ValueError(f"unknown loss_type {loss_type!r}: expected one of {', '.join(RL_LOSSES)}")
    if ref_logprobs is None and kl_beta:
        raise ValueError(f"kl_beta {kl_beta} needs ref_logprobs")
    mask = mask.astype(jnp.float32)
    if old_logprobs is None:
        old_logprobs = jax.lax.stop_gradient(logprobs)
    advantages = advantages[:, None]  # (N, 1)
    ratio = jnp.exp(logprobs - old_logprobs)  # (N, T)
    clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)  # (N, T)
    per_token = -jnp.minimum(ratio * advantages, clipped * advantages)  # (N, T)
    metrics = {}
    if ref_logprobs is not None:
        kl = k3_kl(logprobs, ref_logprobs) * (ratio if kl_importance_weighted else 1.0)  # (N, T)
        per_token = per_token + kl_beta * kl
        metrics["kl"] = masked_mean(kl, mask)
    per_sequence = jnp.sum(per_token * mask, axis=1)  # (N,)
    tokens = jnp.sum(mask, axis=1)  # (N,)
    if loss_type == "grpo":
        loss = jnp.mean(per_sequence / jnp.maximum(tokens, 1.0))
    elif loss_type == "dr_grpo":
        loss = jnp.sum(per_sequence) / (mask.shape[0] * max_completion_length)
    else:
        loss = jnp.sum(per_sequence) / jnp.maximum(jnp.sum(tokens), 1.0)

    low = ((ratio < 1.0 - clip_low) & (advantages < 0)).astype(jnp.float32)  # (N, T)
    high = ((ratio > 1.0 + clip_high) & (advantages > 0)).astype(jnp.float32)  # (N, T)

    def per_sequence_fraction(clipped_tokens: jax.Array) -> jax.Array:  # (N,), NaN for sequences without tokens
        return jnp.where(tokens > 0, jnp.sum(clipped_tokens * mask, axis=1) / jnp.maximum(tokens, 1.0), jnp.nan)

    metrics |= {"clip_ratio_low": masked_mean(low, mask), "clip_ratio_high": masked_mean(high, mask),
                "clip_ratio_region": masked_mean(jnp.maximum(low, high), mask),
                "clip_ratio_low_min": jnp.nanmin(per_sequence_fraction(low)),
                "clip_ratio_high_max": jnp.nanmax(per_sequence_fraction(high))}
    return loss, metrics
