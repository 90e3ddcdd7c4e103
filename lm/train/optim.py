"""AdamW with linear warmup, cosine decay and global-norm clipping; the schedule's lengths resolved from
the run."""

import jax
import ml_collections
import optax

from lm.layers.moe import EXPERTS_NAME
from lm.layers.options import check_declared, declared_copy
from lm.layers.transformer import SCANNED_NAME
from lm.train.options import DERIVED


def resolve_schedule(config: ml_collections.ConfigDict, recorded: dict | None = None) -> ml_collections.ConfigDict:
    """A copy of config whose optimizer.decay_steps and warmup_steps are numbers of steps: each one left at
    DERIVED takes its value from recorded (the optimizer section of the config.json a run folder already
    holds, so that a resumed run keeps its schedule), else decay_steps = train.num_steps and warmup_steps =
    warmup_fraction of decay_steps, rounded. Explicit values stay. The trainer, its dry run and config.json
    all use this copy; resolving it again changes nothing. First every declared choice and range of config
    is checked (check_declared: every run passes here before anything is written or compiled); the copy
    keeps the declarations."""
    cfg, recorded = config.optimizer, recorded or {}
    check_declared(config)
    resolved = declared_copy(config)
    if cfg.decay_steps == DERIVED:
        resolved.optimizer.decay_steps = recorded.get("decay_steps", config.train.num_steps)
    if cfg.warmup_steps == DERIVED:
        derived = round(cfg.warmup_fraction * resolved.optimizer.decay_steps)
        resolved.optimizer.warmup_steps = recorded.get("warmup_steps", derived)
    return resolved


def schedule_warning(cfg, num_steps: int) -> str | None:
    """One line when a resolved schedule does not end with the run (train.num_steps): its warmup is not
    over, or its decay ends before the run does (the learning rate then holds at min_learning_rate) or
    after (the run stops above it); None when the decay ends at the last step."""
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


def make_optimizer(cfg) -> optax.GradientTransformation:
    return optax.chain(
        optax.clip_by_global_norm(cfg.grad_clip_norm),
        optax.adamw(
            learning_rate_schedule(cfg),
            b1=cfg.b1,
            b2=cfg.b2,
            weight_decay=cfg.weight_decay,
            mask=decay_mask,
        ),
    )
