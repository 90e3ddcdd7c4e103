"""The trainer: one loop for every experiment.

train(config, workdir, make_experiment) builds the experiment (make_experiment is the build of the
module config.experiment names, which the `lm` command resolves), the mesh and the sharded state;
resumes from the latest checkpoint in workdir if there is one (on any mesh: the data position is the
step); then runs jitted train steps with periodic logging, evaluation and asynchronous
checkpoints. SIGTERM or SIGINT saves a checkpoint and stops; a NaN/Inf loss or gradient never
updates the weights (train.on_nonfinite: stop or skip). With several processes (lm.distributed) each
loads only its rows of every batch, all of them save the checkpoints together, and process 0 alone
writes the logs and results.
"""

import contextlib
import itertools
import json
import math
import pathlib
import signal
import threading
import time
from collections.abc import Callable, Iterator

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from lm import runs, sharding
from lm.console import steady_output
from lm.distributed import host_local, is_primary
from lm.errors import UserError
from lm.layers.moe import parameter_counts
from lm.progress import RunEta, folder_listing, format_duration, shown_path
from lm.runs import CONFIG_FILE, METRICS_FILE, RESULTS_FILE, SUMMARY_FILE
from lm.train import init_from
from lm.train.checkpoint import Checkpointer, IncompatibleCheckpoint, error_number, os_error_in, write_failed
from lm.train.compiled import CompiledPerShape, compile_in_parallel
from lm.train.evaluate import Evaluations
from lm.train.flops import non_embedding_params, peak_flops_per_device, scale_facts
from lm.train.lock import workdir_lock
from lm.train.metrics import MetricWriter, device_memory, drop_logs, mean_metrics, memory_text, truncate_log
from lm.train.optim import decay_start, resolve_schedule, trainable_line, wsd_resume_limit
from lm.train.prefetch import DevicePrefetcher
from lm.train.profile import PROFILE_DIR, ProfileWindow, profile_window
from lm.train.setup import MakeExperiment, Setup, build, checkpoint_directory, prepared_directory


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


def count_nonfinite(unchecked: list[tuple[int, jax.Array]], policy: str,
                    last_finite: Callable[[], int | None]) -> int:
    """How many steps the (first step, (n,) nonfinite flags of steps first .. first + n - 1) pairs flag
    with a NaN/Inf loss or gradient (the step did not update the weights); with policy 'stop', the
    first one is a UserError instead, naming last_finite(): the newest checkpoint whose parameters
    and optimizer state are all finite (an update with finite gradients may still have made them Inf)."""
    flags = jax.device_get([flag for _, flag in unchecked])
    bad = [first + i for (first, _), step_flags in zip(unchecked, flags, strict=True)
           for i in np.flatnonzero(np.ravel(step_flags) > 0)]
    if bad and policy == "stop":
        step = last_finite()
        saved = f"the checkpoint at step {step} is the newest whose parameters and optimizer state are finite" \
            if step is not None else "no checkpoint with finite parameters and optimizer state yet"
        raise UserError(
            f"the loss or the gradients became NaN/Inf at step {bad[0]} (that update was not applied, "
            f"nothing was saved after it; {saved}): lower optimizer.learning_rate or raise warmup_steps, "
            "or pass --config.train.on_nonfinite=skip to skip such steps and go on"
        )
    for step in bad:
        print(f"step {step:>6} | NaN/Inf loss or gradients: update skipped (train.on_nonfinite=skip)")
    return len(bad)


AUTO_DISPATCH_SECONDS = 0.01  # train.steps_per_dispatch=0: a dispatch's estimated length at least this
ASSUMED_UTILISATION = 0.4  # the share of the peak a step is assumed to reach for that estimate
MAX_AUTO_DISPATCH = 16  # the most steps per dispatch it picks


def auto_steps_per_dispatch(flops_per_step: float, peak: float | None, intervals: tuple[int, ...]) -> int:
    """train.steps_per_dispatch=0: steps per dispatch for steps of flops_per_step model FLOPs on devices of peak
    FLOP/s in all (None: unknown, a CPU): 1 where the peak (or the FLOPs) are unknown or a step is estimated (at
    ASSUMED_UTILISATION of the peak) to take AUTO_DISPATCH_SECONDS or more; else k steps that together take that
    long: the smallest divisor of the log, eval and checkpoint intervals (their gcd) that is that many or more,
    up to MAX_AUTO_DISPATCH (else the largest divisor under it), so that every dispatch between boundaries has
    the same k steps (one compiled program). A function of the config and the devices alone: a resumed run
    picks the same k; and k steps in a dispatch make the updates of k single steps (up to the order of float
    sums in the two programs)."""
    if not peak or not flops_per_step:
        return 1
    needed = math.ceil(AUTO_DISPATCH_SECONDS * peak * ASSUMED_UTILISATION / flops_per_step)
    if needed <= 1:
        return 1
    period = math.gcd(*intervals)
    divisors = [k for k in range(1, min(period, MAX_AUTO_DISPATCH) + 1) if period % k == 0]
    return next((k for k in divisors if k >= needed), divisors[-1])


def steps_until_boundary(step: int, steps_per_dispatch: int, num_steps: int, intervals: tuple[int, ...]) -> int:
    """How many steps the next dispatch runs after step: steps_per_dispatch, or fewer to stop at the
    next multiple of an interval (a log, eval or checkpoint step) or at num_steps."""
    boundary = min([num_steps] + [(step // every + 1) * every for every in intervals])
    return min(steps_per_dispatch, boundary - step)


def train(
    config: ml_collections.ConfigDict, workdir: str, make_experiment: MakeExperiment,
    devices: list[jax.Device] | None = None,
) -> dict[str, float]:
    """Trains make_experiment(config, workdir) to config.train.num_steps on devices (default: all); returns
    the last evaluators' metrics (prefixed with their names: eval_loss, ...) and run facts. Raises Stopped
    when SIGTERM or SIGINT ended it early (after saving a checkpoint). A second run on the same workdir
    stops at once (lm.train.lock). The schedule's lengths left to the run (lm.train.optim.resolve_schedule)
    are the ones the workdir's config.json records, when it has one: a resumed run keeps its schedule. A
    write that fails (a full disk, a read-only or removed folder) is a one-line UserError that names the
    checkpoint left intact (write_errors)."""
    config = init_from.model_from_source(config)  # init_from_config: the model of init_from's config.json
    # The lock first: a second run stops before it reads any data. A run that a check stops leaves no folder.
    # Printing never ends the run (lm.console): a broken stdout (a pipe whose reader is gone) costs no checkpoint.
    with (steady_output(), prepared_directory(workdir) as workdir_path,
          workdir_lock(workdir_path, jax.process_index()) as locked):
        saved = runs.saved_config(workdir_path)  # a resumed run keeps the schedule its config.json records
        config = resolve_schedule(config, saved["optimizer"] if saved else None)
        finished_step = finished_run_step(config, workdir_path)
        if finished_step is not None:  # the same command again: nothing to load or compile
            print(nothing_to_do(finished_step, config.train.num_steps))
            return {"step": finished_step}
        setup = build(config, make_experiment, devices, workdir_path)
        with (jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules),
              write_errors(workdir_path, checkpoint_directory(config, workdir_path), locked)):
            summary = _train_locked(setup, workdir_path)
    stopped_by = summary.pop("stopped_by", None)
    if stopped_by:
        raise Stopped(stopped_by, summary["step"])
    return summary


@contextlib.contextmanager
def write_errors(workdir: pathlib.Path, checkpoints: str, locked: Callable[[], bool]) -> Iterator[None]:
    """Turns an error of the block that the operating system caused (a write into the run's folders that
    failed: a full disk, a read-only or removed folder) into a one-line UserError that names the file, the
    checkpoint that is intact and what to do (lm.train.checkpoint.write_failed). The workdir was removed
    (or replaced) during the run when its lock file is gone (locked() is False)."""
    try:
        yield
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 (not every library's failed write is an OSError: tokenizers' is not)
        cause = os_error_in(e)
        if error_number(cause) is None:
            raise
        file = getattr(cause, "filename", None)
        what = f"writing {file}" if file else f"writing in {workdir}"
        raise write_failed(what if locked() else f"{workdir} was removed during the run: {what}", e, workdir,
                           checkpoints) from e


def finished_run_step(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> int | None:
    """The step of a run that finished in workdir with this very config (config.json equal to it,
    results.json written at train.num_steps or later), else None."""
    config_path, results_path = workdir / CONFIG_FILE, workdir / RESULTS_FILE
    if not (config_path.is_file() and results_path.is_file()):
        return None
    if runs.read_json(config_path, runs.CONFIG_REMEDY) != json.loads(config.to_json_best_effort()):
        return None
    step = runs.read_json(results_path, runs.RESULTS_REMEDY).get("step", -1)
    return step if isinstance(step, int) and step >= config.train.num_steps else None


def nothing_to_do(step: int, num_steps: int) -> str:
    return f"already trained to step {step} (train.num_steps={num_steps}); nothing to do"


def restore_own(checkpointer: Checkpointer, state_shapes, config: ml_collections.ConfigDict,
                workdir: pathlib.Path) -> tuple[int, object] | None:
    """The run's latest checkpoint (Checkpointer.restore_latest), or None; a WSD run whose decay moved goes on
    from its latest checkpoint before the decay began (lm.train.optim.wsd_resume_limit), and where none is left
    that is a UserError. One of another model is a UserError that names the fields of the model and data
    sections in which the workdir's config.json (the config that wrote it) differs from config, with both
    values; the first array of another shape where none do."""
    saved = runs.saved_config(workdir)
    limit = wsd_resume_limit(saved["optimizer"] if saved else None, config.optimizer)
    try:
        restored = checkpointer.restore_latest(state_shapes, config.train.restore_fallback, at_most=limit)
    except IncompatibleCheckpoint as e:
        fields = runs.differing_fields(saved, config, ("model", "data")) if saved else []
        if not fields:
            raise
        overrides = "the override" if len(fields) == 1 else "the overrides"
        raise UserError(f"{workdir} holds a run with {runs.settings(fields, saved=True)} ({CONFIG_FILE}), this "
                        f"config has {runs.settings(fields, saved=False)}: drop {overrides} (or resume with "
                        f"{runs.override_flags(fields)}) or use another --workdir") from e
    if limit is not None and restored is None and checkpointer.manager.all_steps():
        recorded = saved["optimizer"]["decay_steps"]
        raise UserError(f"{workdir} holds no checkpoint from before its WSD decay (step {limit} or earlier) to "
                        f"train on with the decay at step {config.optimizer.decay_steps}: resume with "
                        f"--config.optimizer.decay_steps={recorded} (the schedule it was trained with), or use "
                        "another --workdir")
    return restored


def _train_locked(setup: Setup, workdir: pathlib.Path) -> dict[str, float]:
    """train(), once the workdir is checked and this process holds its lock: restore or initialise
    the state, then the Trainer's loop over the prefetched batches."""
    config, tcfg = setup.config, setup.config.train
    state_shapes, state_shardings = setup.abstract_state()
    checkpoints = checkpoint_directory(config, workdir)
    chosen = tcfg.checkpoint_dir and "://" not in checkpoints  # (the workdir's own was checked above)
    with prepared_directory(checkpoints, "--config.train.checkpoint_dir") if chosen else contextlib.nullcontext():
        stable_end = decay_start(config.optimizer)  # (kept: a WSD run given more steps goes on from there)
        checkpointer = Checkpointer(checkpoints, tcfg.keep_checkpoints, () if stable_end is None else (stable_end,))
        try:
            restored = restore_own(checkpointer, state_shapes, config, workdir)
            initial_params = init_from.prepare(config.init_from, config.init_from_rename, state_shapes.params,
                                               resumed_step=restored[0] if restored else None, config=config)
            summary_path = workdir / SUMMARY_FILE
            previous_summary = runs.read_json(summary_path, runs.SUMMARY_REMEDY) if summary_path.is_file() else {}
        except BaseException:
            checkpointer.close()  # (its background clean-up must end before the process does)
            raise
    # Every check has passed: from here on the workdir is written to.
    with checkpointer:
        if is_primary():
            runs.write_json(workdir / CONFIG_FILE, json.loads(config.to_json_best_effort()))
            setup.experiment.save_assets(workdir)

        if restored is None:
            state = setup.init_state(state_shardings)
            if initial_params:
                state = state.replace(params=initial_params.load(state.params, state_shardings.params, setup.mesh))
            setup.experiment.prepare(state.params, workdir)  # (DPO: the reference's scores of its pairs)
            start_step = 0
            if is_primary():  # what an attempt killed before its first checkpoint logged: one history, not two
                drop_logs(workdir)
        else:
            start_step, state = restored
            if is_primary():
                truncate_log(workdir / METRICS_FILE, start_step)
            print(f"resumed from step {start_step} in {workdir}")
            if replaced := checkpointer.discard_after(start_step):  # a WSD run's earlier decay (restore_own)
                print(f"removed the checkpoints after it (steps {', '.join(map(str, replaced))}): the decay moved "
                      f"to step {config.optimizer.decay_steps}")
        train_iter = iter(setup.train_data(start_step))
        if start_step >= tcfg.num_steps and (workdir / RESULTS_FILE).is_file():
            print(nothing_to_do(start_step, tcfg.num_steps))
            return {"step": start_step}

        writer = MetricWriter(workdir, tcfg.wandb_project, config.to_dict())
        try:
            # Global batches on the devices, loaded tcfg.prefetch ahead by a thread (0: in the loop);
            # the thread waits for each copy to finish, so a queued batch is ready for the step.
            batches = DevicePrefetcher(
                train_iter,
                lambda b: jax.block_until_ready(sharding.assemble_batch(b, setup.mesh, tcfg.batch_size)),
                tcfg.prefetch,
            )
            profile = ProfileWindow(profile_window(tcfg.profile, tcfg.num_steps),
                                    workdir / PROFILE_DIR / f"process_{jax.process_index()}", start_step)
            with StopSignal(tcfg.log_every) as stop, batches, profile:
                trainer = Trainer(setup, state_shardings, checkpointer, writer, workdir)
                summary = trainer.run(state, batches, start_step, stop, profile)
        except BaseException:
            with contextlib.suppress(OSError):  # the error in the block is the one to report
                writer.close()
            raise
        writer.close()
    summary = {**previous_summary, **summary}  # a resumed run keeps what earlier segments measured
    if is_primary():
        runs.write_json(workdir / SUMMARY_FILE, {k: v for k, v in summary.items() if k != "stopped_by"})
        if "stopped_by" not in summary:
            print(finished_line(summary, workdir))
    return summary


def finished_line(summary: dict, workdir: pathlib.Path) -> str:
    """A finished run's last line: 'done: eval loss 1.8818 at step 2000; outputs in runs/baby (checkpoints/,
    config.json, metrics.jsonl, ...)', with the held-out results of results.json after the eval loss."""
    step = summary["step"]
    head = f"eval loss {summary['eval_loss']:.4f} at step {step}" if "eval_loss" in summary else f"step {step}"
    results = runs.read_json(workdir / RESULTS_FILE, runs.RESULTS_REMEDY)
    scores = "".join(f" | {key} {value:.4g}" for key, value in results.items() if key != "step")
    return f"done: {head}{scores}; outputs in {shown_path(workdir)} ({folder_listing(workdir)})"


class Trainer:
    """The loop's parts, each in one place: the compiled train and eval steps, the evaluators (the
    loss on the eval data as `eval`, then the experiment's own, each every so many steps), the
    throughput log (with MFU where the peak is known: lm.train.flops), the checkpoint policy (every
    train.checkpoint_every steps, at the end and on a stop signal) and the NaN/Inf policy
    (train.on_nonfinite)."""

    def __init__(self, setup: Setup, state_shardings, checkpointer: Checkpointer, writer: MetricWriter,
                 workdir: pathlib.Path):
        self.setup, self.config, self.tcfg = setup, setup.config, setup.config.train
        self.checkpointer, self.writer, self.workdir = checkpointer, writer, workdir
        self.batch_sharding = sharding.batch_sharding(setup.mesh)
        self.train_step = CompiledPerShape(setup.jit_train_step(state_shardings))
        self.steps_per_dispatch = self.tcfg.steps_per_dispatch  # 0 (auto): chosen in run()
        self.evaluations = Evaluations(setup, state_shardings.params)

    def evaluate(self, step: int, state, elapsed_seconds: float) -> dict[str, float]:
        """The evaluators due at step (all of them at step 0 and at the last step): their metrics
        (Evaluations.run), printed and written."""
        last = step == self.tcfg.num_steps
        due = [e for e in self.evaluations.evaluators if e.every and (step % e.every == 0 or last)]
        results = self.evaluations.run(due, state.params, prefix=f"step {step:>6} | ")
        if results:
            # elapsed_seconds: wall time since this segment's loop started (compiles included), for
            # time-to-accuracy curves
            self.writer.write_scalars(step, {**results, "elapsed_seconds": elapsed_seconds})
        return results

    def precompile(self, state, first_batch) -> None:
        """The train step for every batch shape the data can yield and the eval step for every eval
        batch, compiled at once (in parallel)."""
        def abstract(batch) -> dict[str, jax.ShapeDtypeStruct]:
            return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=self.batch_sharding), batch)

        compile_in_parallel(
            [(self.train_step, state, (variant,) * self.steps_per_dispatch)
             for variant in self.setup.experiment.batch_variants(abstract(first_batch))]
            + [(self.evaluations.eval_step, state.params, abstract(b)) for b in self.evaluations.eval_batches]
        )

    def run(self, state, batches, start_step: int, stop: StopSignal, profile: ProfileWindow) -> dict[str, float]:
        """Trains from start_step to train.num_steps (or a stop signal) on batches, the global training
        batches from start_step on, already on the devices, tracing profile's window; then (unless stopped)
        the experiment's texts and final results. The logged metrics hold the device memory where the
        backend reports it (lm.train.metrics.device_memory)."""
        tcfg, experiment = self.tcfg, self.setup.experiment
        num_params, _ = parameter_counts(state.params)
        active_params = experiment.active_params(state.params)
        units_per_step = tcfg.batch_size * experiment.units_per_example
        flops_per_step = tcfg.batch_size * experiment.flops_per_example(active_params)
        mesh = self.setup.mesh
        device_peak = tcfg.peak_flops or peak_flops_per_device(mesh.devices.flat[0])  # None: unknown (a CPU)
        peak = device_peak * mesh.size if device_peak else None  # no MFU without a real peak
        print(f"{num_params:,} parameters ({active_params:,} active) | mesh {dict(mesh.shape)} | "
              f"{mesh.devices.flat[0].device_kind}")
        boundaries = (tcfg.log_every, tcfg.checkpoint_every, *(e.every for e in self.evaluations.evaluators if e.every))
        if not tcfg.steps_per_dispatch:
            self.steps_per_dispatch = auto_steps_per_dispatch(flops_per_step, peak, boundaries)
            if self.steps_per_dispatch > 1:
                print(f"{self.steps_per_dispatch} steps per dispatch (train.steps_per_dispatch=0: short steps)")
        if lora := trainable_line(state.params):  # LoRA: what trains, as peft says it
            print(lora)

        step = start_step
        loop_start = time.perf_counter()
        if step < tcfg.num_steps:
            first = next(batches)
            batches = itertools.chain([first], batches)
            self.precompile(state, first)
        last_eval = self.evaluate(step, state, time.perf_counter() - loop_start) if step == 0 else {}
        pending: list[dict] = []  # metrics (n,) of each dispatch since the last log line
        unchecked: list[tuple[int, jax.Array]] = []  # (first step, (n,) nonfinite flags) since the last check
        skipped = 0
        interval_start, interval_steps, rollout_seconds = time.perf_counter(), 0, 0.0
        eta = RunEta(tcfg.num_steps)
        stopping = False
        stable_end = decay_start(self.config.optimizer)  # a WSD run saves its last stable step
        # Nothing here waits for the devices between log, eval and checkpoint steps: the device values
        # (metrics, NaN flags) are read there, and the host runs ahead, dispatching the next steps.
        while step < tcfg.num_steps and not stopping:
            stop_at = stable_end if stable_end is not None and step < stable_end < tcfg.num_steps else tcfg.num_steps
            count = steps_until_boundary(step, self.steps_per_dispatch, stop_at, boundaries)
            fetched = tuple(next(batches) for _ in range(count))
            rollout_start = time.perf_counter()  # (online experiments make their batches with the params)
            batch_group, made = experiment.rollout(state.params, fetched, step)
            if made:  # an online experiment's: the time it took is not the train step's
                rollout_seconds += time.perf_counter() - rollout_start
            interval_start += profile.before(step, count, state)  # (the profiler's own time is not training time)
            compile_seconds = self.train_step.seconds
            with jax.profiler.StepTraceAnnotation("train", step_num=step):
                state, metrics = self.train_step(state, batch_group)
            interval_start += self.train_step.seconds - compile_seconds  # compiling is not training time
            pending.append({**metrics, **{name: np.full(count, value) for name, value in made.items()}})
            unchecked.append((step + 1, metrics["nonfinite"]))
            step += count
            interval_start += profile.after(step, (state, metrics))
            interval_steps += count
            stopping = stop.stop_after(step)
            log_now = step % tcfg.log_every == 0 or step == tcfg.num_steps
            # The first dispatch of a run (or of a resumed one) is printed at once, not log_every steps
            # later; the log files keep one record every log_every steps, as if it had not been.
            print_now = log_now or step - count == start_step
            save_now = step % tcfg.checkpoint_every == 0 or step in (tcfg.num_steps, stable_end) or stopping
            if log_now or save_now:
                skipped += count_nonfinite(unchecked, tcfg.on_nonfinite, self.checkpointer.last_finite_step)
                unchecked = []
            if print_now:
                scalars = mean_metrics(pending)
                step_time = (time.perf_counter() - interval_start) / interval_steps
                train_time = step_time - rollout_seconds / interval_steps  # without making the batches
                scalars.update(
                    steps_per_second=1 / step_time,
                    **{f"{experiment.unit}_per_second": units_per_step / step_time},
                    **({f"train_{experiment.unit}_per_second": units_per_step / train_time} if rollout_seconds else {}),
                    **({"mfu": flops_per_step / step_time / peak} if peak else {}),
                    **device_memory(mesh.local_devices),
                )
                if log_now:
                    self.writer.write_scalars(step, scalars)
                mfu = f"MFU {scalars['mfu']:.1%} | " if peak else ""
                line = (f"step {step:>6} | loss {scalars['loss']:.4f} | lr {scalars['learning_rate']:.2e} | "
                        f"{units_per_step / step_time:,.0f} {experiment.unit}/s | {mfu}{memory_text(scalars)}")
                left = eta.seconds_left(step)  # None on the first line: one dispatch tells no pace
                print(line.removesuffix(" | ") if left is None else f"{line}ETA {format_duration(left)}")
            if log_now:
                pending = []
                interval_start, interval_steps, rollout_seconds = time.perf_counter(), 0, 0.0
            evaluated = self.evaluate(step, state, time.perf_counter() - loop_start)
            if evaluated:
                last_eval = {**last_eval, **evaluated}
                interval_start, interval_steps, rollout_seconds = time.perf_counter(), 0, 0.0
            if save_now:
                self.checkpointer.save(step, state)
        if step == tcfg.num_steps == 0 and self.checkpointer.manager.latest_step() is None:
            self.checkpointer.save(0, state)  # a run of no steps: its initial parameters (init_from's) are saved

        summary = {"step": step, **last_eval, "num_params": num_params, "active_params": active_params,
                   "non_embedding_params": non_embedding_params(state.params),
                   **scale_facts(step, units_per_step, flops_per_step, experiment.unit), "skipped_steps": skipped}
        if self.train_step.compiled:  # this segment trained (a rerun of a finished run does not)
            summary["compile_seconds"] = self.train_step.seconds + self.evaluations.eval_step.seconds
            summary["train_seconds"] = time.perf_counter() - loop_start  # compiles, evals, checkpoints included
        if stopping:
            return {**summary, "stopped_by": stop.received}
        return {**summary, **self.finish(state, step)}

    def finish(self, state, step: int) -> dict[str, float]:
        """After the last step: the experiment's texts (samples, translations) and its held-out results
        (written to results.json)."""
        texts = self.setup.experiment.texts(host_local(state.params))
        self.writer.write_texts(step, texts)
        for name, text in texts.items():
            print(f"--- {name} ---\n{text}")
        results = self.evaluations.final_results(state.params, self.workdir)
        if is_primary():
            runs.write_json(self.workdir / RESULTS_FILE, {"step": step, **results})
        if results:
            self.writer.write_scalars(step, results)
            print("results: " + " | ".join(f"{k} {v:.4g}" for k, v in results.items()))
        return results
