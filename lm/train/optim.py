"""AdamW with linear warmup, cosine decay and global-norm clipping; the schedule's lengths resolved from
the run. Where the parameters hold LoRA adapters, only they train: the rest is frozen (trainable)."""

import flax.linen as nn
import jax
import ml_collections
import optax

from lm.layers.lora import has_adapters, is_adapter
from lm.layers.moe import EXPERTS_NAME
from lm.layers.options import check_declared, declared_copy
from lm.layers.transformer import SCANNED_NAME
from lm.train.options import DERIVED


def resolve_schedule(config: ml_collections.ConfigDict, recorded: dict | None = None) -> ml_collections.ConfigDict:
    """A copy of config whose optimizer.decay_steps and warmup_steps are numbers of steps: each one left at
    DERIVED takes its value from recorded (the optimizer section of the config.json a run folder already
    holds, so that a resumed run keeps its schedule), else decay_steps = train.num_steps (1 for a run of 0
    steps) and warmup_steps = warmup_fraction of decay_steps, rounded. Explicit values stay. The trainer, its
    dry run and config.json all use this copy; resolving it again changes nothing. First every declared choice
    and range of config is checked (check_declared: every run passes here before anything is written or
    compiled); the copy keeps the declarations."""
    cfg, recorded = config.optimizer, recorded or {}
    check_declared(config)
    resolved = declared_copy(config)
    if cfg.decay_steps == DERIVED:
        resolved.optimizer.decay_steps = recorded.get("decay_steps", max(1, config.train.num_steps))
    if cfg.warmup_steps == DERIVED:
        derived = round(cfg.warmup_fraction * resolved.optimizer.decay_steps)
        resolved.optimizer.warmup_steps = recorded.get("warmup_steps", derived)
    return resolved


def schedule_warning(cfg, num_steps: int) -> str | None:
    """One line when a resolved schedule does not end with the run (train.num_steps): its warmup is not
    over, or its decay ends before the run does (the learning rate then holds at min_learning_rate) or
    after (the run stops above it); None when the decay ends at the last step, or the run makes no step."""
    if num_steps == 0:
        return None
    last = float(learning_rate_schedule(cfg)(num_steps - 1))  # the last update's learning rate
    fix = f"--config.optimizer.decay_steps={num_steps} decays over the whole run"
    if cfg.warmup_steps >= num_steps:
        return (f"warning: optimizer.warmup_steps={cfg.warmup_steps} does not end by train.num_steps={num_steps}: "
                f"the run stops still warming up, at learning rate {last:.2e} of {cfg.learning_rate:.2e}")
    if cfg.decay_steps < num_steps:
        return (f"warning: optimizer.decay_steps={cfg.decay_steps} ends before train.num_steps={num_steps}: the "
                f"learning rate holds at min_learning_rate={cfg.min_learning_rate:.2e} for the last "
                f"{num_steps - cfg.decay_steps} steps; {fix}")
    if cfg.decay_steps > num_steps:
        return (f"warning: optimizer.decay_steps={cfg.decay_steps} ends after train.num_steps={num_steps}: the run "
                f"stops at learning rate {last:.2e}, above min_learning_rate={cfg.min_learning_rate:.2e}; {fix}")
    return None


def learning_rate_schedule(cfg) -> optax.Schedule:
    """Linear warmup from 0 to learning_rate, cosine decay to min_learning_rate at decay_steps (of a
    config resolve_schedule resolved)."""
    if DERIVED in (cfg.warmup_steps, cfg.decay_steps):
        raise ValueError("optimizer.warmup_steps or decay_steps is unresolved: pass the config through "
                         "resolve_schedule first")
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=cfg.learning_rate,
        warmup_steps=cfg.warmup_steps,
        decay_steps=max(cfg.decay_steps, cfg.warmup_steps + 1),
        end_value=cfg.min_learning_rate,
    )


def decay_mask(params):
    """Weight decay on matrices and embeddings only, not on biases or norm scales, also where they are
    stacked: over layers by nn.scan (under 'blocks') or over mixture-of-experts experts."""

    def is_matrix(path, p) -> bool:
        stacked_axes = sum(getattr(key, "key", None) in (SCANNED_NAME, EXPERTS_NAME) for key in path)
        return p.ndim - stacked_axes >= 2

    return jax.tree_util.tree_map_with_path(is_matrix, params)


def trainable(params):
    """Per leaf of params (or of a tree shaped like them), whether the optimizer updates it: every leaf; where
    params hold LoRA adapters (lm/layers/lora.py), the adapters alone. A boxed parameter (nn.Partitioned, at
    init) is one leaf, so that a frozen one leaves no box in the optimizer state."""
    adapters_only = has_adapters(params)
    return jax.tree_util.tree_map_with_path(lambda path, _: not adapters_only or is_adapter(path), params,
                                            is_leaf=lambda x: isinstance(x, nn.Partitioned))


def frozen_gradients_stopped(params):
    """params with the gradient stopped at every leaf the optimizer leaves alone (not trainable): the train step
    differentiates through this, so the gradients of frozen weights are never computed (they are zeros)."""
    return jax.tree.map(lambda p, train: p if train else jax.lax.stop_gradient(p), params, trainable(params))


def trainable_only(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """inner on the trainable leaves alone, the others frozen: a zero update and no optimizer state. A tree whose
    leaves are all trainable gets inner itself (and inner's state)."""
    partitioned = optax.multi_transform(
        {"trained": inner, "frozen": optax.set_to_zero()},
        lambda params: jax.tree.map(lambda train: "trained" if train else "frozen", trainable(params)))

    def chosen(tree) -> optax.GradientTransformation:
        return partitioned if has_adapters(tree) else inner

    return optax.GradientTransformation(lambda params: chosen(params).init(params),
                                        lambda updates, state, params=None: chosen(updates).update(updates, state,
                                                                                                   params))


def make_optimizer(cfg) -> optax.GradientTransformation:
    """AdamW after global-norm clipping, on the trainable leaves (with LoRA adapters, those alone)."""
    return trainable_only(optax.chain(
        optax.clip_by_global_norm(cfg.grad_clip_norm),
        optax.adamw(
            learning_rate_schedule(cfg),
            b1=cfg.b1,
            b2=cfg.b2,
            weight_decay=cfg.weight_decay,
            mask=decay_mask,
        ),
    ))
