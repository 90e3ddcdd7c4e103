"""Progress lines for long passes (decoding, evaluation, tokenising): one helper for all of them.

A Progress counts the chunks of a pass as they finish and, once `every` seconds have gone by since the
pass began (or since its last line), prints where it stands:

  decoding 1,000 sentences (beam 4): 3 of 8 | 41.2 sentences/s | ETA 0:00:30

A pass shorter than `every` seconds prints nothing. await_each feeds it from asynchronously dispatched
JAX computations, counting each one when it is ready while the next one is already queued.
"""

import datetime
import itertools
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
