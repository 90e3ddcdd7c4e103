"""Optimizers and learning-rate schedules by name (optimizer.name, optimizer.schedule), after global-norm
clipping; the schedule's lengths resolved from the run. Weight decay is decoupled (multiplied by the learning
rate, as AdamW's) and falls on matrices and embeddings only (decay_mask), whatever the optimizer. Muon
orthogonalises the updates of the blocks' matrices and leaves the rest (embeddings, head, norms, biases) to
AdamW, each group at its own learning rate. Where the parameters hold LoRA adapters, only they train: the rest
is frozen (trainable). Under μP (model.parametrization=mup) the hidden matrices' updates of the Adam-like
optimizers are scaled by mup_base_width / embed_dim (mup_width_ratio)."""

import math
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax
from optax.contrib import MuonDimensionNumbers, scale_by_muon

from lm.errors import UserError
from lm.layers.lora import has_adapters, is_adapter
from lm.layers.moe import EXPERTS_NAME
from lm.layers.options import check_declared, declared_copy, from_section
from lm.layers.transformer import SCANNED_NAME, TransformerConfig, is_block_name
from lm.train.options import DERIVED, OPTIMIZERS, SCHEDULES, derived_eval_every


def resolve_schedule(config: ml_collections.ConfigDict, recorded: dict | None = None) -> ml_collections.ConfigDict:
    """A copy of config whose optimizer.decay_steps and warmup_steps are numbers of steps: each one left at
    DERIVED takes its value from recorded (the optimizer section of the config.json a run folder already
    holds, so that a resumed run keeps its schedule), else decay_steps = train.num_steps (1 for a run of 0
    steps) and warmup_steps = warmup_fraction of decay_steps, rounded. One exception: a WSD schedule's derived
    decay_steps is always train.num_steps, so that a run resumed with more steps goes on in its stable phase
    and decays at its new end (wsd_resume_limit). An eval.every left at DERIVED becomes derived_eval_every of
    train.num_steps (the run's own, a resumed one's too). Explicit values stay. The trainer, its dry run and
    config.json all use this copy; resolving it again changes nothing. First every declared choice and range
    of config is checked (check_declared: every run passes here before anything is written or compiled); the
    copy keeps the declarations."""
    cfg, recorded = config.optimizer, recorded or {}
    check_declared(config)
    resolved = declared_copy(config)
    if cfg.decay_steps == DERIVED:
        run_end = max(1, config.train.num_steps)
        follows_run = cfg.get("schedule") == "wsd"
        resolved.optimizer.decay_steps = run_end if follows_run else recorded.get("decay_steps", run_end)
    if cfg.warmup_steps == DERIVED:
        derived = round(cfg.warmup_fraction * resolved.optimizer.decay_steps)
        resolved.optimizer.warmup_steps = recorded.get("warmup_steps", derived)
    if config.get("eval") is not None and config.eval.get("every") == DERIVED:
        resolved.eval.every = derived_eval_every(config.train.num_steps)
    return resolved


def decay_start(cfg) -> int | None:
    """The first step of a WSD schedule's decay (the stable phase ends there: decay_fraction of decay_steps
    before its end, not before the warmup ends); None for the other schedules (of a resolved config)."""
    if cfg.get("schedule") != "wsd":
        return None
    return max(cfg.warmup_steps, cfg.decay_steps - round(cfg.decay_fraction * cfg.decay_steps))


def wsd_resume_limit(recorded: dict | None, cfg) -> int | None:
    """The newest step a WSD run may resume from when its decay moved (train.num_steps changed since
    recorded, the optimizer section of its config.json, was written): the step where the earlier decay
    started, or the new one where that is earlier. A checkpoint after it holds weights trained at the earlier
    decay's lower learning rates, which the new schedule does not have there. None when nothing limits it."""
    if not recorded or recorded.get("schedule") != "wsd" or cfg.get("schedule") != "wsd" \
            or recorded.get("decay_steps") == cfg.decay_steps:
        return None
    return min(decay_start(ml_collections.ConfigDict(recorded)), decay_start(cfg))


def schedule_warning(cfg, num_steps: int) -> str | None:
    """One line when a resolved schedule does not end with the run (train.num_steps): its warmup is not
    over, or its decay ends before the run does (the learning rate then holds at min_learning_rate) or
    after (the run stops above it); None when the decay ends at the last step, the run makes no step or
    the schedule is constant."""
    if num_steps == 0:
        return None
    last = float(learning_rate_schedule(cfg)(num_steps - 1))  # the last update's learning rate
    fix = f"--config.optimizer.decay_steps={num_steps} decays over the whole run"
    if cfg.warmup_steps >= num_steps:
        return (f"warning: optimizer.warmup_steps={cfg.warmup_steps} does not end by train.num_steps={num_steps}: "
                f"the run stops still warming up, at learning rate {last:.2e} of {cfg.learning_rate:.2e}")
    if cfg.get("schedule") == "constant":
        return None
    if cfg.decay_steps < num_steps:
        return (f"warning: optimizer.decay_steps={cfg.decay_steps} ends before train.num_steps={num_steps}: the "
                f"learning rate holds at min_learning_rate={cfg.min_learning_rate:.2e} for the last "
                f"{num_steps - cfg.decay_steps} steps; {fix}")
    if cfg.decay_steps > num_steps:
        return (f"warning: optimizer.decay_steps={cfg.decay_steps} ends after train.num_steps={num_steps}: the run "
                f"stops at learning rate {last:.2e}, above min_learning_rate={cfg.min_learning_rate:.2e}; {fix}")
    return None


def one_minus_sqrt_decay(init_value: float, end_value: float, transition_steps: int) -> optax.Schedule:
    """init_value - (init_value - end_value) * sqrt(t / transition_steps), then end_value: the 1-sqrt
    cooldown of Hägele et al. 2024 (Scaling Laws and Compute-Optimal Training Beyond Fixed Training Durations)."""

    def schedule(step):
        done = jnp.clip(step / transition_steps, 0.0, 1.0)
        return init_value - (init_value - end_value) * jnp.sqrt(done)

    return schedule


def decay(shape: str, peak: float, end: float, steps: int) -> optax.Schedule:
    """From peak to end over steps (at least 1), then end: linearly, along a half cosine, or as 1-sqrt."""
    steps = max(steps, 1)
    if shape == "linear":
        return optax.linear_schedule(peak, end, steps)
    if shape == "cosine":
        return optax.cosine_decay_schedule(peak, steps, alpha=end / peak if peak else 0.0)
    return one_minus_sqrt_decay(peak, end, steps)


def learning_rate_schedule(cfg, peak: float | None = None, end: float | None = None) -> optax.Schedule:
    """The learning rate of each step (of a config resolve_schedule resolved), from peak (default
    learning_rate) to end (default min_learning_rate): a linear warmup from 0 over warmup_steps, then
    cosine: a cosine decay to end at decay_steps; linear: a linear one; constant: peak from then on;
    wsd (warmup, stable, decay): peak until decay_start, then decay_shape down to end at decay_steps.
    After decay_steps the learning rate holds at end."""
    if DERIVED in (cfg.warmup_steps, cfg.decay_steps):
        raise ValueError("optimizer.warmup_steps or decay_steps is unresolved: pass the config through "
                         "resolve_schedule first")
    peak = cfg.learning_rate if peak is None else peak
    end = cfg.min_learning_rate if end is None else end
    warmup, decay_steps = cfg.warmup_steps, max(cfg.decay_steps, cfg.warmup_steps + 1)
    name = cfg.get("schedule", "cosine")  # (runs saved before optimizer.schedule have none: cosine)
    if name == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, peak, warmup, decay_steps, end)
    warming = optax.linear_schedule(0.0, peak, warmup)
    if name == "constant":  # (optax.warmup_constant_schedule stays at 0 without a warmup)
        return optax.join_schedules([warming, optax.constant_schedule(peak)], [warmup])
    if name == "linear":
        return optax.join_schedules([warming, decay("linear", peak, end, decay_steps - warmup)], [warmup])
    if name != "wsd":
        raise UserError(f"optimizer.schedule={name!r}: use one of {SCHEDULES}")
    stable_end = decay_start(cfg)
    return optax.join_schedules(
        [warming, optax.constant_schedule(peak), decay(cfg.decay_shape, peak, end, decay_steps - stable_end)],
        [warmup, stable_end])


def decay_mask(params):
    """Weight decay on matrices and embeddings only, not on biases or norm scales, also where they are
    stacked: over layers by nn.scan (under 'blocks') or over mixture-of-experts experts."""
    return jax.tree_util.tree_map_with_path(lambda path, p: is_matrix(path_names(path), p.ndim), params)


def is_matrix(names: tuple[str, ...], ndim: int) -> bool:
    """Whether the parameter at names is a matrix (a kernel or an embedding): two axes or more besides the
    stacked ones, and no bias (an attention projection's bias has two: heads x head size)."""
    return ndim - stacked_axes(names) >= 2 and names[-1:] != ("bias",)


def trainable(params):
    """Per leaf of params (or of a tree shaped like them), whether the optimizer updates it: every leaf; where
    params hold LoRA adapters (lm/layers/lora.py), the adapters alone. A boxed parameter (nn.Partitioned, at
    init) is one leaf, so that a frozen one leaves no box in the optimizer state."""
    adapters_only = has_adapters(params)
    return jax.tree_util.tree_map_with_path(lambda path, _: not adapters_only or is_adapter(path), params,
                                            is_leaf=lambda x: isinstance(x, nn.Partitioned))


def trainable_line(params) -> str | None:
    """Where params (arrays or ShapeDtypeStructs) hold LoRA adapters, what trains, as peft's
    print_trainable_parameters says it: 'trainable params: 294,912 || all params: 124,734,720 || trainable%:
    0.2364' (all params: the adapters too); None where every parameter trains."""
    if not has_adapters(params):
        return None
    sizes = [math.prod(leaf.shape) for leaf in jax.tree.leaves(params)]
    total = sum(sizes)
    trained = sum(size for size, train in zip(sizes, jax.tree.leaves(trainable(params)), strict=True) if train)
    return f"trainable params: {trained:,d} || all params: {total:,d} || trainable%: {100 * trained / total:.4f}"


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


def decoupled(scale: optax.GradientTransformation, cfg, schedule: optax.Schedule) -> optax.GradientTransformation:
    """scale's updates, then decoupled weight decay on decay_mask's leaves, all times the learning rate (as
    optax.adamw composes Adam's)."""
    return optax.chain(scale, optax.add_decayed_weights(cfg.weight_decay, decay_mask),
                       optax.scale_by_learning_rate(schedule))


# Kernels (in axes..., out axes...) whose module takes several input axes: attention's output projection,
# (heads, head_dim) -> embed. Every other kernel has one input axis (lm/layers/linear.py Linear).
MULTI_INPUT_MODULES = ("out",)


def path_names(path) -> tuple[str, ...]:
    """The dictionary keys of a pytree path (a boxed leaf's box adds none)."""
    return tuple(key.key for key in path if hasattr(key, "key"))


def stacked_axes(names: tuple[str, ...]) -> int:
    """The leading axes a parameter is stacked over: layers (under nn.scan's 'blocks'), experts."""
    return sum(name in (SCANNED_NAME, EXPERTS_NAME) for name in names)


def muon_dimensions(names: tuple[str, ...], ndim: int) -> MuonDimensionNumbers:
    """How Muon sees a kernel as a (fan_in, fan_out) matrix: its stacked axes are batch axes, its input axes
    the reduction axes (the first, or all but the last for MULTI_INPUT_MODULES), the rest the output axes."""
    first = stacked_axes(names)
    inputs = ndim - 1 - first if len(names) > 1 and names[-2] in MULTI_INPUT_MODULES else 1
    return MuonDimensionNumbers(tuple(range(first, first + inputs)), tuple(range(first + inputs, ndim)))


def muon_labels(pattern: str):
    """params -> per leaf (a boxed parameter is one leaf) 'muon' where its '/'-joined path matches pattern
    (re.search) and it is a matrix (is_matrix), else 'adamw'. No leaf for Muon is a
    UserError that names the option, as is a pattern that is no regular expression."""
    try:
        matches = re.compile(pattern).search
    except re.error as e:
        raise UserError(f"optimizer.muon_params={pattern!r} is no regular expression ({e})") from e

    def labels(params):
        def label(path, leaf) -> str:
            names = path_names(path)
            return "muon" if is_matrix(names, jnp.ndim(nn.unbox(leaf))) and matches("/".join(names)) else "adamw"

        labelled = jax.tree_util.tree_map_with_path(label, params, is_leaf=lambda x: isinstance(x, nn.Partitioned))
        if "muon" not in jax.tree.leaves(labelled):
            example = "/".join(path_names(jax.tree_util.tree_flatten_with_path(params)[0][0][0]))
            raise UserError(f"optimizer.muon_params={pattern!r} matches no matrix of this model's parameters "
                            f"(paths such as {example!r}): pass a regular expression that finds its matrices")
        return labelled

    return labels


def muon_learning_rate_schedule(cfg) -> optax.Schedule:
    """Muon's learning rate: the schedule of learning_rate, scaled to peak at muon_learning_rate."""
    scale = cfg.muon_learning_rate / cfg.learning_rate if cfg.learning_rate else 0.0
    return learning_rate_schedule(cfg, cfg.muon_learning_rate, cfg.min_learning_rate * scale)


def logged_learning_rates(cfg, model=None) -> dict[str, optax.Schedule]:
    """The learning rates a train step logs, by metric name: learning_rate, Muon's own (muon_learning_rate)
    where Muon updates the matrices, and under μP (model: the config's model section) the hidden matrices'
    (hidden_learning_rate: learning_rate * mup_base_width / embed_dim) where an Adam-like optimizer trains them."""
    rates = {"learning_rate": learning_rate_schedule(cfg)}
    if cfg.get("name", "adamw") == "muon":  # (runs saved before optimizer.name have none: AdamW)
        rates["muon_learning_rate"] = muon_learning_rate_schedule(cfg)
    elif (ratio := mup_width_ratio(cfg, model)) is not None:
        rates["hidden_learning_rate"] = lambda step: ratio * rates["learning_rate"](step)
    return rates


def muon(cfg, schedule: optax.Schedule) -> optax.GradientTransformation:
    """Muon (optax.contrib.scale_by_muon: Nesterov momentum muon_momentum, Newton-Schulz orthogonalisation,
    updates scaled by sqrt(max(1, fan_out / fan_in)) as optax.contrib.muon does) on the matrices muon_params
    picks, at muon_learning_rate on the same schedule; AdamW on every other leaf, at learning_rate."""
    muon_schedule = muon_learning_rate_schedule(cfg)

    def dimensions(updates):  # the Muon group's leaves (the others are optax's MaskedNode: no leaves)
        return jax.tree_util.tree_map_with_path(lambda path, x: muon_dimensions(path_names(path), x.ndim), updates)

    def width_scale(updates, params=None):
        def scaled(path, x):
            dims = muon_dimensions(path_names(path), x.ndim)
            fan_in = math.prod(x.shape[axis] for axis in dims.reduction_axis)
            fan_out = math.prod(x.shape[axis] for axis in dims.output_axis)
            return x * math.sqrt(max(1.0, fan_out / fan_in))

        return jax.tree_util.tree_map_with_path(scaled, updates)

    orthogonalised = optax.chain(
        scale_by_muon(beta=cfg.muon_momentum, weight_dimension_numbers=dimensions), optax.stateless(width_scale))
    return optax.partition(
        {"muon": decoupled(orthogonalised, cfg, muon_schedule),
         "adamw": optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay, mask=decay_mask)},
        muon_labels(cfg.muon_params))


def update_rule(cfg) -> optax.GradientTransformation:
    """The optimizer optimizer.name names, on its learning_rate_schedule, with decoupled weight decay on
    decay_mask's leaves."""
    schedule = learning_rate_schedule(cfg)
    name = cfg.get("name", "adamw")  # (runs saved before optimizer.name have none: AdamW)
    if name == "adamw":
        return optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay, mask=decay_mask)
    if name == "lion":
        return optax.lion(schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay, mask=decay_mask)
    if name == "sgd":
        return decoupled(optax.trace(cfg.momentum, nesterov=True), cfg, schedule)
    if name == "adafactor":  # optax.adafactor's scaling, without its parameter-scale (relative) step size
        return decoupled(optax.chain(optax.scale_by_factored_rms(), optax.clip_by_block_rms(1.0)), cfg, schedule)
    if name == "muon":
        return muon(cfg, schedule)
    raise UserError(f"optimizer.name={name!r}: use one of {OPTIMIZERS}")


def boxes_fitted(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """inner, whose state at init drops the axis names (the nn.Partitioned box) of each leaf not shaped like
    the parameter it stands for (in a subtree shaped like the parameters): Adafactor's factored row and column
    statistics, vectors then replicated; the statistics shaped like their parameters stay sharded like them."""

    def is_boxed(x) -> bool:
        return isinstance(x, nn.Partitioned)

    def init(params):
        params_tree = jax.tree.structure(params, is_leaf=is_boxed)

        def like_params(x) -> bool:
            return jax.tree.structure(x, is_leaf=is_boxed) == params_tree

        def fitted(statistic, param):
            reshaped = is_boxed(statistic) and jnp.shape(statistic.value) != jnp.shape(nn.unbox(param))
            return statistic.value if reshaped else statistic

        return jax.tree.map(lambda x: jax.tree.map(fitted, x, params, is_leaf=is_boxed) if like_params(x) else x,
                            inner.init(params), is_leaf=like_params)

    return optax.GradientTransformation(init, inner.update)


# μP's Adam column (Tensor Programs V, Table 3) holds for optimizers whose updates are normalised per entry.
MUP_OPTIMIZERS = ("adamw", "lion", "adafactor", "muon")


def mup_width_ratio(cfg, model) -> float | None:
    """mup_base_width / embed_dim where the model section (None: not a Transformer's) asks for μP, else None.
    An optimizer μP does not cover here is a UserError: SGD's column of Table 3 (embedding and bias learning
    rates growing with fan_out) is not implemented."""
    if model is None or model.get("parametrization", "standard") != "mup":
        return None
    name = cfg.get("name", "adamw")
    if name not in MUP_OPTIMIZERS:
        raise UserError(f"model.parametrization=mup has no rule for optimizer.name={name!r} here: use one of "
                        f"{MUP_OPTIMIZERS}, or parametrization=standard")
    return from_section(TransformerConfig, model).width_ratio  # (checked: a base width is set)


def is_hidden_matrix(names: tuple[str, ...], ndim: int) -> bool:
    """Whether the parameter at names is one of μP's hidden matrices: a kernel of a Transformer block (under
    block_<i> or the scanned stack), whose fan-in and fan-out grow with the width (a mixture-of-experts
    router's fan-out does not: its learning rate is that of an output layer under Adam, 1/fan_in all the same)."""
    return is_matrix(names, ndim) and any(name == SCANNED_NAME or is_block_name(name) for name in names)


def hidden_matrices_scaled(ratio: float, muon_params: str | None) -> optax.GradientTransformation:
    """Multiplies the updates of the hidden matrices (is_hidden_matrix) by ratio: μP's learning rate
    base_width / width of Adam-like optimizers. muon_params: Muon's pattern, whose matrices are left alone (their
    orthogonalised updates, scaled by sqrt(fan_out / fan_in), already keep their effect width-independent)."""

    def scale(updates, params=None):
        muon = muon_labels(muon_params)(updates) if muon_params is not None else \
            jax.tree.map(lambda _: "adamw", updates)

        def scaled(path, update, label):
            hidden = label == "adamw" and is_hidden_matrix(path_names(path), update.ndim)
            return update * ratio if hidden else update

        return jax.tree_util.tree_map_with_path(scaled, updates, muon)

    return optax.stateless(scale)


def make_optimizer(cfg, model=None) -> optax.GradientTransformation:
    """optimizer.name's update rule after global-norm clipping, on the trainable leaves (with LoRA adapters,
    those alone). model: the config's model section; under μP (mup_width_ratio) the hidden matrices' updates are
    then scaled to their width (hidden_matrices_scaled): learning_rate is that of every other parameter."""
    rule = [optax.clip_by_global_norm(cfg.grad_clip_norm), update_rule(cfg)]
    if (ratio := mup_width_ratio(cfg, model)) is not None:
        rule.append(hidden_matrices_scaled(ratio, cfg.muon_params if cfg.get("name") == "muon" else None))
    return trainable_only(boxes_fitted(optax.chain(*rule)))
