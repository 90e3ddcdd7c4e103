"""AdamW with linear warmup, cosine decay and global-norm clipping."""

import jax
import optax

from lm.layers.moe import EXPERTS_NAME
from lm.layers.transformer import SCANNED_NAME


def learning_rate_schedule(cfg) -> optax.Schedule:
    """Linear warmup from 0 to learning_rate, cosine decay to min_learning_rate at decay_steps."""
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
