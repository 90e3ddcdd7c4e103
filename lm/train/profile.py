"""The profiler window: train.profile=START:STOP traces the steps after step START up to step STOP.

The steps are counted as the log counts them (step N: after N updates), so 2:4 traces steps 3 and 4, like
the Python slice [2:4] of 0-based updates. With train.steps_per_dispatch=k > 1 the window widens to whole
dispatches (one program runs k steps); the printed line names the steps traced. Before the trace starts
the loop waits for the steps already dispatched, and before it stops for the window's own steps, so the
trace holds exactly those steps' device work (and any eval or checkpoint that falls between them). Each
dispatch is marked with jax.profiler.StepTraceAnnotation("train", step_num=its first 0-based update).

Every process traces its own devices into WORKDIR/profile/process_<i> (its index): TensorBoard's profile
plugin opens WORKDIR/profile (`tensorboard --logdir`, one run per process) and ui.perfetto.dev the
perfetto_trace.json.gz the process prints.
"""

import pathlib
import re
import time

import jax

from lm.errors import UserError

PROFILE_DIR = "profile"  # in the workdir: one folder per process
PERFETTO_FILE = "perfetto_trace.json.gz"
WINDOW = re.compile(r"\s*(-?\d+)\s*:\s*(-?\d+)\s*")


def profile_window(text: str, num_steps: int) -> tuple[int, int] | None:
    """(START, STOP) of train.profile's 'START:STOP', None for '' (no trace). A UserError, one line, for
    text that is not two integers, START >= STOP or a window outside the run's steps 0 to num_steps."""
    if not text:
        return None
    match = WINDOW.fullmatch(text)
    if not match:
        raise UserError(f"train.profile={text!r}: write START:STOP, two step numbers (e.g. 10:20 traces steps 11 "
                        "to 20), or '' for no trace")
    start, stop = int(match[1]), int(match[2])
    if start >= stop:
        raise UserError(f"train.profile={text!r}: START must be below STOP (START:STOP traces the steps after "
                        f"step START up to step STOP, e.g. {max(start, 0)}:{max(start, 0) + 2})")
    if start < 0 or stop > num_steps:
        raise UserError(f"train.profile={text!r} lies outside the run's steps 0 to {num_steps} (train.num_steps): "
                        f"use 0 <= START < STOP <= {num_steps}")
    return start, stop


def perfetto_trace(folder: pathlib.Path) -> pathlib.Path | None:
    """The newest Perfetto trace that jax.profiler wrote under folder (plugins/profile/<time>/), or None."""
    traces = sorted(folder.glob(f"plugins/profile/*/{PERFETTO_FILE}"))
    return traces[-1] if traces else None


def trace_written(folder: pathlib.Path, what: str) -> str:
    """The line that says where the trace of `what` went and how to open it."""
    perfetto = perfetto_trace(folder)
    opens = f"; Perfetto: open {perfetto} at ui.perfetto.dev" if perfetto else ""
    return f"profile of {what}: {folder} (tensorboard --logdir {folder.parent}{opens})"


def steps_traced(first: int, last: int) -> str:
    """The steps first .. last in words."""
    if last < first:
        return "no step"
    return f"step {last}" if last == first else f"steps {first} to {last}"


class ProfileWindow:
    """Starts and stops jax.profiler's trace around the dispatches of the window (profile_window) as the
    loop calls before() and after() each dispatch; a context manager that stops a trace still running when
    the loop ends early (a stop signal, an error). window None: never traces."""

    def __init__(self, window: tuple[int, int] | None, folder: pathlib.Path, start_step: int):
        self.window, self.folder, self.start_step = window, folder, start_step
        self.first: int | None = None  # while the trace runs: its first step (the log's numbering)
        self.last = 0  # while the trace runs: the last step dispatched

    def __enter__(self) -> "ProfileWindow":
        if self.window and self.start_step >= self.window[1]:
            start, stop = self.window
            print(f"train.profile={start}:{stop}: this run resumes at step {self.start_step}, after the window: "
                  "no trace")
        return self

    def __exit__(self, *exc) -> None:
        if self.first is not None:
            self._stop(" (the run stopped inside the window)")

    def before(self, step: int, count: int, state) -> float:
        """Before the dispatch of steps step + 1 .. step + count: starts the trace where they reach into the
        window (after the steps dispatched earlier finished on the devices: state is their result). Returns
        the seconds the profiler itself took (not training time)."""
        if self.first is not None or not self._reaches_window(step, count):
            return 0.0
        jax.block_until_ready(state)
        began = time.perf_counter()
        self.folder.mkdir(parents=True, exist_ok=True)
        jax.profiler.start_trace(self.folder, create_perfetto_trace=True)
        self.first, self.last = step + 1, step
        return time.perf_counter() - began

    def _reaches_window(self, step: int, count: int) -> bool:
        """Whether the steps step + 1 .. step + count overlap the window's steps START + 1 .. STOP."""
        return self.window is not None and step < self.window[1] and step + count > self.window[0]

    def after(self, step: int, outputs) -> float:
        """After the dispatch that ends at step: once the window's last step is dispatched, waits for
        outputs (the state and metrics of that dispatch), stops the trace and prints where it went. Returns
        the seconds the profiler itself took."""
        if self.first is None:
            return 0.0
        self.last = step
        if step < self.window[1]:
            return 0.0
        jax.block_until_ready(outputs)
        began = time.perf_counter()
        self._stop()
        return time.perf_counter() - began

    def _stop(self, note: str = "") -> None:
        jax.profiler.stop_trace()
        print(trace_written(self.folder, steps_traced(self.first, self.last) + note))
        self.first = None
