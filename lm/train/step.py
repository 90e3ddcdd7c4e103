"""Pure train and eval steps: step(state, batch) -> (state, metrics), jitted by the loop."""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from lm.layers import constrain
from lm.train.optim import frozen_gradients_stopped
from lm.train.state import TrainState

LossFn = Callable[..., tuple[jax.Array, dict]]  # (params, batch, rng, train) -> (loss, metrics)


def gradient_fn(loss_fn: LossFn, grad_accum_steps: int):
    """(params, batch, rng) -> (loss, metrics, grads), averaged over grad_accum_steps micro-batches; the
    gradients of the leaves the optimizer freezes are zeros, never computed (frozen_gradients_stopped)."""
    value_and_grad = jax.value_and_grad(
        lambda params, batch, rng: loss_fn(frozen_gradients_stopped(params), batch, rng, True), has_aux=True
    )

    def single(params, batch, rng):
        (loss, metrics), grads = value_and_grad(params, batch, rng)
        return loss, metrics, grads

    if grad_accum_steps == 1:
        return single

    def accumulated(params, batch, rng):
        # (B, ...) -> (A, B / A, ...): micro-batch a takes rows a, A + a, 2A + a, ..., so each
        # device's contiguous slice of the batch splits evenly across micro-batches.
        def split(x):
            x = x.reshape(x.shape[0] // grad_accum_steps, grad_accum_steps, *x.shape[1:])
            return constrain(x.swapaxes(0, 1), (None, "batch") + (None,) * (x.ndim - 2))

        def body(carry, inputs):
            micro_batch, index = inputs
            loss, metrics, grads = single(params, micro_batch, jax.random.fold_in(rng, index))
            return jax.tree.map(jnp.add, carry, (loss, metrics, grads)), None

        micro_batches = jax.tree.map(split, batch)
        _, first_metrics, _ = jax.eval_shape(single, params, jax.tree.map(lambda x: x[0], micro_batches), rng)
        zeros = jax.tree.map(
            lambda s: jnp.zeros(s.shape, s.dtype),
            (jax.ShapeDtypeStruct((), jnp.float32), first_metrics, params),
        )
        total, _ = jax.lax.scan(body, zeros, (micro_batches, jnp.arange(grad_accum_steps)))
        return jax.tree.map(lambda x: x / grad_accum_steps, total)

    return accumulated


def make_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    learning_rates: dict[str, optax.Schedule],
    grad_accum_steps: int,
    seed: int,
):
    """(state, batch) -> (state, metrics): one update, the loss's metrics with the loss, the gradient's norm,
    each learning rate of learning_rates at this step (by metric name: optim.logged_learning_rates) and
    whether the step was skipped as nonfinite."""
    compute_gradients = gradient_fn(loss_fn, grad_accum_steps)

    def train_step(state: TrainState, batch) -> tuple[TrainState, dict]:
        rng = jax.random.fold_in(jax.random.key(seed), state.step)
        loss, metrics, grads = compute_gradients(state.params, batch, rng)
        grad_norm = optax.tree.norm(grads)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        # A NaN or Inf loss or gradient never reaches the weights: such a step keeps the previous
        # params and optimizer state (the step count still moves past its batch), and the trainer
        # stops or counts it (train.on_nonfinite).
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        params, opt_state = jax.tree.map(
            lambda new, old: jnp.where(finite, new, old), (params, opt_state), (state.params, state.opt_state)
        )
        metrics = dict(
            metrics,
            loss=loss,
            grad_norm=grad_norm,
            **{name: schedule(state.step) for name, schedule in learning_rates.items()},
            nonfinite=1.0 - finite.astype(jnp.float32),
        )
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return train_step


def make_multi_step(train_step):
    """(state, batches) -> (state, metrics): the train steps of a tuple of n batches in one program (a
    scan over them, stacked (n, B, ...)), the metrics stacked (n,). Running n steps per dispatch saves
    n - 1 trips through the host for small models, whose steps take less time than launching them."""

    def multi_step(state: TrainState, batches: tuple) -> tuple[TrainState, dict]:
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *batches)
        return jax.lax.scan(train_step, state, stacked)

    return multi_step


def make_eval_step(loss_fn: LossFn, weight_fn: Callable[[dict], jax.Array], outputs_fn: Callable[..., Any]):
    """(params, batch) -> (metrics with 'loss', the batch's weight in the eval means, outputs_fn(params,
    batch): the experiment's per-example outputs, e.g. predictions (B, ...), or None). The model's forward
    pass is written twice (loss, outputs) but computed once: XLA merges the identical computations."""

    def eval_step(params, batch) -> tuple[dict, jax.Array, Any]:
        loss, metrics = loss_fn(params, batch, jax.random.key(0), False)
        return dict(metrics, loss=loss), weight_fn(batch), outputs_fn(params, batch)

    return eval_step
