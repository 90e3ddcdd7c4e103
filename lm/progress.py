"""Progress lines for long passes (decoding, evaluation, tokenising): one helper for all of them.

A Progress counts the chunks of a pass as they finish and, once `every` seconds have gone by since the
pass began (or since its last line), prints where it stands:

  decoding 1,000 sentences (beam 4): 3 of 8 | 41.2 sentences/s | ETA 0:00:30

A pass shorter than `every` seconds prints nothing. await_each feeds it from asynchronously dispatched
JAX computations, counting each one when it is ready while the next one is already queued. RunEta is a
training run's time left. A command's last line, its result, names its files with shown_path and
folder_listing.
"""

import datetime
import itertools
import pathlib
import time
from collections.abc import Callable, Iterable, Sized

PROGRESS_SECONDS = 10.0  # a line at most this often, and none for a pass shorter than this


def format_duration(seconds: float) -> str:
    """'0:01:05' for 65 seconds."""
    return str(datetime.timedelta(seconds=round(seconds)))


def length(items: Iterable) -> int | None:
    """len(items), or None for an iterable without a length (a generator)."""
    return len(items) if isinstance(items, Sized) else None


class Progress:
    """The progress of a pass of `total` chunks (None: not known beforehand), rated in `unit`s a
    second (each chunk's size given to advance), a line every `every` seconds (default
    PROGRESS_SECONDS). clock and write are time.perf_counter and print unless a test passes others."""

    def __init__(self, what: str, total: int | None, unit: str, every: float | None = None,
                 clock: Callable[[], float] = time.perf_counter, write: Callable[[str], None] | None = None):
        self.what, self.total, self.unit = what, total, unit
        self.every = PROGRESS_SECONDS if every is None else every
        self.clock = clock
        self.write = write or (lambda line: print(line, flush=True))
        self.start = self.last_line = clock()
        self.chunks = self.items = 0

    def advance(self, items: int = 1) -> None:
        """One more chunk done, holding `items` units; a line if `every` seconds passed since the last."""
        self.chunks += 1
        self.items += items
        now = self.clock()
        if now - self.last_line >= self.every and self.chunks != self.total:
            self.write(self.line(now - self.start))
            self.last_line = now

    def line(self, elapsed: float) -> str:
        """'<what>: <chunks> of <total> | <rate> <unit>/s | ETA <time>' after elapsed seconds."""
        rate = f"{self.items / elapsed:,.1f} {self.unit}/s" if elapsed > 0 else f"{self.items:,} {self.unit}"
        if self.total is None:
            return f"{self.what}: {self.chunks:,} done | {rate}"
        eta = format_duration(elapsed / self.chunks * (self.total - self.chunks))
        return f"{self.what}: {self.chunks:,} of {self.total:,} | {rate} | ETA {eta}"


def shown_path(path: str | pathlib.Path) -> str:
    """path as a result line names it: relative to the working folder where it lies in it, else absolute."""
    path = pathlib.Path(path).expanduser().absolute()
    return str(path.relative_to(pathlib.Path.cwd())) if path.is_relative_to(pathlib.Path.cwd()) else str(path)


def folder_listing(folder: pathlib.Path) -> str:
    """'checkpoints/, config.json, metrics.jsonl': what a folder holds, for a result line (its folders with a
    slash; hidden files, such as the run's lock, left out)."""
    return ", ".join(entry.name + "/" * entry.is_dir() for entry in sorted(folder.iterdir())
                     if not entry.name.startswith("."))


class RunEta:
    """The time a training run has left, at its pace since the end of its first dispatch (which pays the one-time
    costs: buffers allocated, the input pipeline filled, the first program loaded) to num_steps: the wall time per
    step since then (evaluations and checkpoints included, as they recur) times the steps left. Ask at steps whose
    work is done (their results read); the first answer starts the clock and is None, as is any before a step after
    it has finished: no estimate from the first dispatch alone (its time can be many steps' worth)."""

    def __init__(self, num_steps: int, clock: Callable[[], float] = time.perf_counter):
        self.num_steps, self.clock = num_steps, clock
        self.since: tuple[int, float] | None = None  # (step, time) at the end of the first dispatch

    def seconds_left(self, step: int) -> float | None:
        now = self.clock()
        if self.since is None:
            self.since = (step, now)
        first_step, start = self.since
        if step <= first_step:
            return None
        return (now - start) / (step - first_step) * (self.num_steps - step)


def await_each(results: Iterable, progress: Progress, sizes: Iterable[int] | None = None) -> list:
    """The results (JAX arrays or pytrees of them) of an iterable that dispatches one computation each
    time it is drawn, as a list. Each is counted on progress (with its size from sizes, default 1)
    once it is ready, which is waited for only after the next one is dispatched: the device always
    has work queued, and the progress counts finished work, not dispatched work."""
    import jax  # (here: a Progress of a command that runs no JAX, lm prepare's, spares its import)

    sizes = itertools.repeat(1) if sizes is None else iter(sizes)

    def finish(result) -> None:
        jax.block_until_ready(result)
        progress.advance(next(sizes))

    done = []
    for result in results:  # drawing a result dispatches its computation
        if done:
            finish(done[-1])
        done.append(result)
    if done:
        finish(done[-1])
    return done
