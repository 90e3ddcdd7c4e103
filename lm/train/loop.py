"""The trainer: one loop for every experiment.

train(config, workdir) builds the experiment named by config.experiment, the mesh and the sharded
state; resumes from the latest checkpoint in workdir if there is one (on any mesh: the data position
is the step); then runs jitted train steps with periodic logging, evaluation and asynchronous
checkpoints. SIGTERM or SIGINT saves a checkpoint and stops; a NaN/Inf loss or gradient never
updates the weights (train.on_nonfinite: stop or skip). With several processes (lm.distributed) each
loads only its rows of every batch, all of them save the checkpoints together, and process 0 alone
writes the logs and results.
"""

import concurrent.futures
import datetime
import importlib
import itertools
import json
import math
import os
import pathlib
import signal
import sys
import threading
import time
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils
from jax.experimental.compilation_cache import compilation_cache

from lm import sharding
from lm.distributed import is_primary
from lm.errors import UserError
from lm.runs import CONFIG_FILE, METRICS_FILE, RESULTS_FILE, SUMMARY_FILE
from lm.train import init_from
from lm.train.checkpoint import Checkpointer
from lm.train.experiment import Experiment
from lm.train.flops import peak_flops_per_device
from lm.train.lock import workdir_lock
from lm.train.metrics import MetricWriter, truncate_log
from lm.train.optim import learning_rate_schedule, make_optimizer
from lm.train.prefetch import DevicePrefetcher
from lm.train.state import TrainState
from lm.train.step import make_eval_step, make_multi_step, make_train_step


def load_experiment(config: ml_collections.ConfigDict) -> Experiment:
    try:
        module = importlib.import_module(f"experiments.{config.experiment}")
    except ModuleNotFoundError as e:
        raise UserError(f"experiment={config.experiment!r} has no module experiments/{config.experiment}.py") from e
    return module.build(config)


def prepare_directory(directory: str, option: str = "--workdir") -> pathlib.Path:
    """Creates directory if needed and checks that this process can write there; option names the
    flag or config field it came from, for the error."""
    path = pathlib.Path(directory).expanduser().absolute()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write_probe_{jax.process_index()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UserError(f"{path} is not writable ({e.strerror}); pass a {option} you can write to") from e
    return path


def default_compilation_cache() -> str:
    """$JAX_COMPILATION_CACHE_DIR if set, else a per-user folder: $XDG_CACHE_HOME/lm/jax_compilation_cache
    (~/.cache/lm/jax_compilation_cache)."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return os.environ["JAX_COMPILATION_CACHE_DIR"]
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache_home, "lm", "jax_compilation_cache")


def use_compilation_cache(directory: str) -> str:
    """Points JAX's persistent compilation cache at directory, so that compiled programs are stored
    there and reused by later runs and restarts; returns the folder in use ("" for none).

    "auto" (the default) is default_compilation_cache(); when that folder cannot be written the run
    goes on without a cache (with a warning). "none" or "" turns the cache off. Any other directory is
    created, and one this process cannot write to is a UserError. JAX opens its cache once per
    process, at the first compile that uses it, and then ignores changes to the directory: so when the
    directory differs from the one set, the cache is also reset and the next compile opens the new
    one (programs this process compiled before stay in its memory; a notebook that trains again with
    another directory switches to it). JAX writes only programs that took
    jax_persistent_cache_min_compile_time_secs (default 1 s) or more to compile, and only from
    process 0."""
    if directory in ("", "none"):
        jax.config.update("jax_enable_compilation_cache", False)
        return ""
    if directory == "auto":
        try:
            path = str(prepare_directory(default_compilation_cache(), "--config.train.compilation_cache_dir"))
        except UserError as e:
            print(f"warning: no compilation cache: {e}", file=sys.stderr)
            return use_compilation_cache("none")
    else:
        path = str(prepare_directory(directory, "--config.train.compilation_cache_dir"))
    jax.config.update("jax_enable_compilation_cache", True)
    if jax.config.jax_compilation_cache_dir != path:
        jax.config.update("jax_compilation_cache_dir", path)
        compilation_cache.reset_cache()
    return path


def abstract_state(init_boxed, rng, mesh, rules):
    """The state's shapes, dtypes and NamedShardings (from the logical axis names), no compute."""
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        shardings = sharding.logical_shardings(jax.eval_shape(init_boxed, rng), mesh, rules)
        shapes = jax.eval_shape(lambda r: nn.unbox(init_boxed(r)), rng)
    sharding.check_divisible(shapes, shardings)
    return jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings
    ), shardings


def count_params(params) -> int:
    return sum(math.prod(p.shape) for p in jax.tree.leaves(params))


class Stopped(Exception):
    """Training stopped on a signal after saving a checkpoint at `step`; rerunning resumes."""

    def __init__(self, signal_name: str, step: int):
        super().__init__(f"{signal_name}: saved a checkpoint at step {step}; rerun the same command to resume")
        self.signal_name, self.step = signal_name, step


class StopSignal:
    """SIGTERM (preemption) and SIGINT (Ctrl-C) become a flag the loop polls, so that it finishes the
    step, saves a checkpoint and exits. Several processes agree every `every` steps whether any of
    them got a signal, so that all stop after the same step. A context manager: the previous
    handlers come back on exit."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, every: int):
        self.every = every
        self.received: str | None = None
        self._previous = {}

    def __enter__(self) -> "StopSignal":
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name

    def stop_after(self, step: int) -> bool:
        if jax.process_count() == 1:
            return self.received is not None
        if step % self.every:
            return False
        flags = multihost_utils.process_allgather(np.int32(self.received is not None))
        self.received = self.received or ("SIGTERM" if flags.any() else None)  # another process's
        return bool(flags.any())


def count_nonfinite(unchecked: list[tuple[int, jax.Array]], policy: str, last_checkpoint: int | None) -> int:
    """How many steps the (first step, (n,) nonfinite flags of steps first .. first + n - 1) pairs flag
    with a NaN/Inf loss or gradient (the step did not update the weights); with policy 'stop', the
    first one is a UserError instead."""
    flags = jax.device_get([flag for _, flag in unchecked])
    bad = [first + i for (first, _), step_flags in zip(unchecked, flags, strict=True)
           for i in np.flatnonzero(np.ravel(step_flags) > 0)]
    if bad and policy == "stop":
        saved = f"the checkpoint at step {last_checkpoint} is intact" if last_checkpoint else "no checkpoint yet"
        raise UserError(
            f"the loss or the gradients became NaN/Inf at step {bad[0]} (that update was not applied, "
            f"nothing was saved after it; {saved}): lower optimizer.learning_rate or raise warmup_steps, "
            "or pass --config.train.on_nonfinite=skip to skip such steps and go on"
        )
    for step in bad:
        print(f"step {step:>6} | NaN/Inf loss or gradients: update skipped (train.on_nonfinite=skip)")
    return len(bad)


class CompiledPerShape:
    """A jitted step(state_or_params, batch), compiled ahead of time once per batch shape (length-
    bucketed batches bring a few), with the compile seconds kept for the logs; `name` for them."""

    def __init__(self, jitted_step, name: str = "train step"):
        self.jitted_step = jitted_step
        self.name = name
        self.compiled: dict[tuple, jax.stages.Compiled] = {}
        self.seconds = 0.0

    @staticmethod
    def key(batch) -> tuple:
        return tuple(x.shape for x in jax.tree.leaves(batch))

    def __call__(self, state, batch):
        if self.key(batch) not in self.compiled:
            compile_in_parallel([(self, state, batch)])
        return self.compiled[self.key(batch)](state, batch)


def compile_in_parallel(jobs: list[tuple[CompiledPerShape, Any, Any]]) -> None:
    """Compiles each (step, state, batch) job whose shapes its step has not compiled yet: traced and
    lowered one after another, then compiled all at once in threads (XLA compiles them in parallel,
    on as many cores as there are jobs). batch may hold jax.ShapeDtypeStructs. The wall time is
    added to the first job's step."""
    todo: dict[tuple, tuple[CompiledPerShape, Any]] = {}
    for step, state, batch in jobs:
        if step.key(batch) not in step.compiled and (id(step), step.key(batch)) not in todo:
            todo[(id(step), step.key(batch))] = (step, step.jitted_step.lower(state, batch), batch)
    if not todo:
        return
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(todo)) as pool:
        compiled = list(pool.map(lambda job: job[1].compile(), todo.values()))
    seconds = time.perf_counter() - start
    jobs[0][0].seconds += seconds
    for (step, _, batch), executable in zip(todo.values(), compiled, strict=True):
        step.compiled[step.key(batch)] = executable
        shapes = sorted({x.shape for x in jax.tree.leaves(batch)})
        steps = f", {len(batch)} steps per call" if isinstance(batch, tuple) else ""
        print(f"compiled the {step.name} for batch shapes {shapes}{steps}" + (
            f" in {seconds:.1f}s" if len(todo) == 1 else ""))
    if len(todo) > 1:
        print(f"compiled {len(todo)} programs in parallel in {seconds:.1f}s")


def steps_until_boundary(step: int, steps_per_dispatch: int, num_steps: int, intervals: tuple[int, ...]) -> int:
    """How many steps the next dispatch runs after step: steps_per_dispatch, or fewer to stop at the
    next multiple of an interval (a log, eval or checkpoint step) or at num_steps."""
    boundary = min([num_steps] + [(step // every + 1) * every for every in intervals])
    return min(steps_per_dispatch, boundary - step)


def host_local(tree):
    """tree, with arrays this process can compute with on its own: as it is with one process; with
    several, each array gathered whole into host memory (so sampling and decoding after training
    run locally on every process, not as collectives)."""
    return tree if jax.process_count() == 1 else multihost_utils.process_allgather(tree, tiled=True)


def format_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:,.1f} {unit}" if unit != "B" else f"{count:,.0f} B"
        count /= 1024


def format_duration(seconds: float) -> str:
    return str(datetime.timedelta(seconds=round(seconds)))


def mean_metrics(metrics_list: list[dict], weights: list | None = None) -> dict[str, float]:
    """The (weighted) mean of each metric over a list of metric dicts. A metric is a scalar or an
    (n,) array (n steps' values), each value weighted with its dict's weight (default 1)."""
    host, weights = jax.device_get((metrics_list, weights))
    weights = np.ones(len(host)) if weights is None else np.asarray(weights, np.float64)

    def mean(key: str) -> float:
        values = [np.ravel(m[key]) for m in host]
        value_weights = [np.full(len(v), w) for v, w in zip(values, weights, strict=True)]
        return float(np.average(np.concatenate(values), weights=np.concatenate(value_weights)))

    return {k: mean(k) for k in host[0]}


def state_builder(experiment: Experiment, optimizer):
    """rng -> TrainState at step 0, with params still boxed with their logical axis names."""

    def init_boxed(rng):
        params = experiment.init(rng)["params"]
        step = jax.numpy.zeros((), jax.numpy.int32)
        return TrainState(step=step, params=params, opt_state=optimizer.init(params))

    return init_boxed


def init_state(init_boxed, rng: jax.Array, state_shardings) -> TrainState:
    """The step-0 TrainState, created directly in its shardings."""
    return jax.jit(lambda r: nn.unbox(init_boxed(r)), out_shardings=state_shardings)(rng)


def jit_train_step(config: ml_collections.ConfigDict, experiment: Experiment, optimizer, state_shardings, mesh):
    """The jitted (state, (global batch, ...)) -> (state, metrics) program the trainer runs: one train
    step per batch of the tuple (train.steps_per_dispatch of them, fewer before a log, eval or
    checkpoint step), the metrics stacked (n,), the state donated."""
    return jax.jit(
        make_multi_step(make_train_step(experiment.loss, optimizer, learning_rate_schedule(config.optimizer),
                                        config.train.grad_accum_steps, config.seed)),
        in_shardings=(state_shardings, sharding.batch_sharding(mesh)),
        out_shardings=(state_shardings, None),
        donate_argnums=0,
    )


def process_train_data(config: ml_collections.ConfigDict, experiment: Experiment, mesh, start_step: int):
    """This process's rows of every global training batch from batch number start_step on (see
    Experiment.train_data); sharding.assemble_batch makes global arrays of them."""
    shard = sharding.process_batch_shard(mesh)
    return experiment.train_data(config.train.batch_size // shard[1], config.seed, shard, start_step)


def checkpoint_directory(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> str:
    """config.train.checkpoint_dir (a local path, or a URL such as gs://bucket/run for Orbax), or
    by default workdir/checkpoints."""
    chosen = config.train.get("checkpoint_dir", "")  # runs written before the option have none
    if "://" in chosen:
        return chosen
    local = pathlib.Path(chosen).expanduser() if chosen else pathlib.Path(workdir) / "checkpoints"
    return str(local.absolute())  # Orbax wants absolute paths


def restore_params(config: ml_collections.ConfigDict, experiment: Experiment, workdir: pathlib.Path,
                   step: int | None = None):
    """The params of the checkpoint at step (default: the latest) of the run in workdir, on the
    first device."""
    mesh = sharding.make_mesh({axis: 1 for axis in sharding.MESH_AXES}, jax.devices()[:1])
    rules = sharding.logical_rules(config.sharding_rules)
    init_boxed = state_builder(experiment, make_optimizer(config.optimizer))
    state_shapes, _ = abstract_state(init_boxed, jax.random.key(config.seed), mesh, rules)
    directory = checkpoint_directory(config, workdir)
    checkpointer = Checkpointer(directory, config.train.keep_checkpoints)
    try:
        if step is None:
            restored = checkpointer.restore_latest(state_shapes, fallback=False)
            if restored is None:
                raise UserError(f"no checkpoint in {directory}: train first with lm.main")
            return restored[1].params
        return checkpointer.restore_checked(step, state_shapes).params
    finally:
        checkpointer.close()


def build(config: ml_collections.ConfigDict, devices: list[jax.Device] | None):
    """(mesh, logical rules, experiment, optimizer, init_boxed) for config on devices (default: all),
    after checking that the mesh fits the devices and divides the batch; turns on (and names) the
    compilation cache of train.compilation_cache_dir, before anything is compiled."""
    if config.train.on_nonfinite not in ("stop", "skip"):
        raise UserError(f"train.on_nonfinite={config.train.on_nonfinite!r}: use 'stop' or 'skip'")
    if config.train.prefetch < 0:
        raise UserError(f"train.prefetch={config.train.prefetch}: use 0 (off) or more batches")
    if config.train.steps_per_dispatch < 1:
        raise UserError(f"train.steps_per_dispatch={config.train.steps_per_dispatch}: use 1 or more steps")
    cache = use_compilation_cache(config.train.compilation_cache_dir)
    print(f"compilation cache: {cache or 'off'}")
    mesh = sharding.make_mesh(config.mesh.to_dict(), devices)
    sharding.check_batch(config.train.batch_size, config.train.grad_accum_steps, mesh)
    rules = sharding.logical_rules(config.sharding_rules)
    experiment = load_experiment(config)
    optimizer = make_optimizer(config.optimizer)
    return mesh, rules, experiment, optimizer, state_builder(experiment, optimizer)


def dry_run(config: ml_collections.ConfigDict, devices: list[jax.Device] | None = None) -> dict[str, float]:
    """Compiles the train step for config's mesh and one global batch, prints what a step costs and
    returns it, training and writing nothing: parameters (total, active), per-device memory of the
    compiled step (XLA's memory analysis: arguments, outputs, temporaries, generated code), FLOPs
    per step (XLA's count for one device's program; the model estimate for the whole batch) and the
    compile time. A mesh the devices or the batch do not fit, or a shape that does not shard, fails
    here, before any accelerator time is spent."""
    tcfg = config.train
    mesh, rules, experiment, optimizer, init_boxed = build(config, devices)
    host_batch = next(iter(process_train_data(config, experiment, mesh, 0)))
    batch_sharding = sharding.batch_sharding(mesh)
    batch_shapes = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct((tcfg.batch_size, *x.shape[1:]), x.dtype, sharding=batch_sharding), host_batch
    )
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        state_shapes, state_shardings = abstract_state(init_boxed, jax.random.key(config.seed), mesh, rules)
        start = time.perf_counter()
        step = jit_train_step(config, experiment, optimizer, state_shardings, mesh)
        compiled = step.lower(state_shapes, (batch_shapes,)).compile()
        compile_seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    active_params = experiment.active_params(state_shapes.params)
    report = {
        "num_params": count_params(state_shapes.params),
        "active_params": active_params,
        "argument_bytes": memory.argument_size_in_bytes,
        "output_bytes": memory.output_size_in_bytes,
        "alias_bytes": memory.alias_size_in_bytes,
        "temp_bytes": memory.temp_size_in_bytes,
        "code_bytes": memory.generated_code_size_in_bytes,
        "xla_flops_per_device": float(cost.get("flops", float("nan"))),
        "model_flops_per_step": tcfg.batch_size * experiment.flops_per_example(active_params),
        "compile_seconds": compile_seconds,
    }
    peak = report["argument_bytes"] + report["output_bytes"] - report["alias_bytes"] + report["temp_bytes"]
    print(f"dry run: mesh {dict(mesh.shape)} of {mesh.size} x {mesh.devices.flat[0].device_kind} | "
          f"global batch {tcfg.batch_size} (x {tcfg.grad_accum_steps} accumulation steps)")
    print(f"parameters        {report['num_params']:,} ({active_params:,} active)")
    print(f"memory per device arguments {format_bytes(report['argument_bytes'])} | outputs "
          f"{format_bytes(report['output_bytes'])} ({format_bytes(report['alias_bytes'])} of them donated inputs) | "
          f"temporaries {format_bytes(report['temp_bytes'])} | code {format_bytes(report['code_bytes'])} | "
          f"total {format_bytes(peak)}")
    print(f"FLOPs per step    {report['xla_flops_per_device'] / 1e9:,.3f} GFLOP per device (XLA; it counts a loop "
          f"body once: scanned layers and accumulation steps are undercounted) | "
          f"{report['model_flops_per_step'] / 1e9:,.3f} GFLOP for the batch (model: 6N + attention)")
    print(f"compile           {compile_seconds:.1f} s")
    return report


def train(
    config: ml_collections.ConfigDict, workdir: str, devices: list[jax.Device] | None = None
) -> dict[str, float]:
    """Trains to config.train.num_steps on devices (default: all); returns the last eval metrics
    (prefixed 'eval_') and run facts. Raises Stopped when SIGTERM or SIGINT ended it early (after
    saving a checkpoint). A second run on the same workdir stops at once (lm.train.lock)."""
    workdir_path = prepare_directory(workdir)
    mesh, rules, experiment, optimizer, init_boxed = build(config, devices)
    with workdir_lock(workdir_path, jax.process_index()):  # before anything is written there
        return _train_locked(config, workdir_path, mesh, rules, experiment, optimizer, init_boxed)


def _train_locked(config, workdir_path, mesh, rules, experiment, optimizer, init_boxed) -> dict[str, float]:
    """train(), once the workdir is checked and this process holds its lock."""
    tcfg = config.train
    init_rng = jax.random.key(config.seed)

    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        state_shapes, state_shardings = abstract_state(init_boxed, init_rng, mesh, rules)
        checkpoints = checkpoint_directory(config, workdir_path)
        if tcfg.checkpoint_dir and "://" not in checkpoints:  # (the workdir's own was checked above)
            prepare_directory(checkpoints, "--config.train.checkpoint_dir")
        checkpointer = Checkpointer(checkpoints, tcfg.keep_checkpoints)
        try:
            restored = checkpointer.restore_latest(state_shapes, tcfg.restore_fallback)
            initial_params = init_from.prepare(config.init_from, config.init_from_rename, state_shapes.params,
                                               resumed_step=restored[0] if restored else None)
        except BaseException:
            checkpointer.close()  # (its background clean-up must end before the process does)
            raise
        # Every check has passed: from here on the workdir is written to.
        if is_primary():
            (workdir_path / CONFIG_FILE).write_text(config.to_json_best_effort(indent=2))
            experiment.save_assets(workdir_path)

        if restored is None:
            state = init_state(init_boxed, init_rng, state_shardings)
            if initial_params:
                state = state.replace(params=initial_params.load(state.params, state_shardings.params, mesh))
            start_step = 0
        else:
            start_step, state = restored
            if is_primary():
                truncate_log(workdir_path / METRICS_FILE, start_step)
            print(f"resumed from step {start_step} in {workdir_path}")
        train_iter = iter(process_train_data(config, experiment, mesh, start_step))
        if start_step >= tcfg.num_steps and (workdir_path / RESULTS_FILE).is_file():
            checkpointer.close()
            print(f"already trained to step {start_step} (train.num_steps={tcfg.num_steps}); nothing to do")
            return {"step": start_step}

        writer = MetricWriter(workdir_path, tcfg.wandb_project, config.to_dict())
        try:
            # Global batches on the devices, loaded tcfg.prefetch ahead by a thread (0: in the loop);
            # the thread waits for each copy to finish, so a queued batch is ready for the step.
            batches = DevicePrefetcher(
                train_iter,
                lambda b: jax.block_until_ready(sharding.assemble_batch(b, mesh, tcfg.batch_size)),
                tcfg.prefetch,
            )
            with StopSignal(tcfg.log_every) as stop, batches:
                summary = _train_loop(config, experiment, mesh, state, state_shardings, batches,
                                      optimizer, checkpointer, writer, start_step, workdir_path, stop)
        finally:
            checkpointer.close()
            writer.close()
    summary_path = workdir_path / SUMMARY_FILE
    previous = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    stopped_by = summary.pop("stopped_by", None)
    summary = {**previous, **summary}  # a resumed run keeps what earlier segments measured
    if is_primary():
        summary_path.write_text(json.dumps(summary, indent=2))
    if stopped_by:
        raise Stopped(stopped_by, summary["step"])
    return summary


def _train_loop(config, experiment, mesh, state, state_shardings, batches, optimizer,
                checkpointer, writer, start_step, workdir, stop: StopSignal) -> dict[str, float]:
    """batches: the global training batches from start_step on, already on the devices."""
    tcfg = config.train
    batch_sharding = sharding.batch_sharding(mesh)
    train_step = CompiledPerShape(jit_train_step(config, experiment, optimizer, state_shardings, mesh))
    eval_step = CompiledPerShape(jax.jit(
        make_eval_step(experiment.loss, experiment.eval_weight), in_shardings=(state_shardings.params, batch_sharding)
    ), "eval step")
    eval_batches = list(experiment.eval_data())

    num_params = count_params(state.params)
    active_params = experiment.active_params(state.params)
    units_per_step = tcfg.batch_size * experiment.units_per_example
    flops_per_step = tcfg.batch_size * experiment.flops_per_example(active_params)
    peak = (tcfg.peak_flops or peak_flops_per_device(mesh.devices.flat[0])) * mesh.size
    print(f"{num_params:,} parameters ({active_params:,} active) | mesh {dict(mesh.shape)} | "
          f"{mesh.devices.flat[0].device_kind}")

    def evaluate_batches(batches) -> dict[str, float]:
        """Weighted mean metrics (per real token, say, not per padded batch) of global batches."""
        outputs = [eval_step(state.params, sharding.place_batch(b, mesh)) for b in batches]
        metrics, weights = zip(*outputs, strict=True)
        return mean_metrics(list(metrics), list(weights))

    def evaluate(step: int) -> dict[str, float]:
        results = {f"eval_{k}": v for k, v in evaluate_batches(eval_batches).items()}
        # elapsed_seconds: wall time since this segment's loop started (compiles included), for
        # time-to-accuracy curves
        writer.write_scalars(step, {**results, "elapsed_seconds": time.perf_counter() - loop_start})
        print(f"step {step:>6} | eval loss {results['eval_loss']:.4f}")
        return results

    def abstract(batch) -> dict[str, jax.ShapeDtypeStruct]:
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=batch_sharding), batch)

    step = start_step
    last_checkpoint = start_step or None
    loop_start = time.perf_counter()
    if step < tcfg.num_steps:  # every batch shape of the train and eval data, compiled at once
        first = next(batches)
        batches = itertools.chain([first], batches)
        group = min(tcfg.steps_per_dispatch, tcfg.num_steps - step)
        compile_in_parallel(
            [(train_step, state, (variant,) * group) for variant in experiment.batch_variants(abstract(first))]
            + [(eval_step, state.params, abstract(b)) for b in eval_batches]
        )
    last_eval = evaluate(step) if step == 0 else {}
    pending: list[dict] = []  # metrics (n,) of each dispatch since the last log line
    unchecked: list[tuple[int, jax.Array]] = []  # (first step, (n,) nonfinite flags) since the last check
    skipped = 0
    interval_start, interval_steps = time.perf_counter(), 0
    stopping = False
    # Nothing here waits for the devices between log, eval and checkpoint steps: the device values
    # (metrics, NaN flags) are read there, and the host runs ahead, dispatching the next steps.
    while step < tcfg.num_steps and not stopping:
        count = steps_until_boundary(step, tcfg.steps_per_dispatch, tcfg.num_steps,
                                     (tcfg.log_every, config.eval.every, tcfg.checkpoint_every))
        batch_group = tuple(next(batches) for _ in range(count))
        compile_seconds = train_step.seconds
        state, metrics = train_step(state, batch_group)
        interval_start += train_step.seconds - compile_seconds  # compiling is not training time
        pending.append(metrics)
        unchecked.append((step + 1, metrics["nonfinite"]))
        step += count
        interval_steps += count
        stopping = stop.stop_after(step)
        log_now = step % tcfg.log_every == 0 or step == tcfg.num_steps
        save_now = step % tcfg.checkpoint_every == 0 or step == tcfg.num_steps or stopping
        if log_now or save_now:
            skipped += count_nonfinite(unchecked, tcfg.on_nonfinite, last_checkpoint)
            unchecked = []
        if log_now:
            scalars = mean_metrics(pending)
            step_time = (time.perf_counter() - interval_start) / interval_steps
            scalars.update(
                steps_per_second=1 / step_time,
                **{f"{experiment.unit}_per_second": units_per_step / step_time},
                mfu=flops_per_step / step_time / peak,
            )
            writer.write_scalars(step, scalars)
            print(
                f"step {step:>6} | loss {scalars['loss']:.4f} | lr {scalars['learning_rate']:.2e} | "
                f"{units_per_step / step_time:,.0f} {experiment.unit}/s | MFU {scalars['mfu']:.1%} | "
                f"ETA {format_duration((tcfg.num_steps - step) * step_time)}"
            )
            pending = []
            interval_start, interval_steps = time.perf_counter(), 0
        if step % config.eval.every == 0 or step == tcfg.num_steps:
            last_eval = evaluate(step)
            interval_start, interval_steps = time.perf_counter(), 0
        if save_now:
            checkpointer.save(step, state)
            last_checkpoint = step

    summary = {"step": step, **last_eval, "num_params": num_params, "active_params": active_params,
               "skipped_steps": skipped}
    if train_step.compiled:  # this segment trained (a rerun of a finished run does not)
        summary["compile_seconds"] = train_step.seconds + eval_step.seconds
        summary["train_seconds"] = time.perf_counter() - loop_start  # compiles, evals, checkpoints included
    if stopping:
        return {**summary, "stopped_by": stop.received}
    params = host_local(state.params)
    texts = experiment.texts(params)
    writer.write_texts(step, texts)
    for name, text in texts.items():
        print(f"--- {name} ---\n{text}")
    results = experiment.final_results(params, evaluate_batches, workdir)
    if is_primary():
        (workdir / RESULTS_FILE).write_text(json.dumps({"step": step, **results}, indent=2))
    if results:
        writer.write_scalars(step, results)
        print("results: " + " | ".join(f"{k} {v:.4g}" for k, v in results.items()))
    return {**summary, **results}
