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
