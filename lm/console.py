"""Printing that never fails a command: stdout and stderr whose reader is gone.

`lm train ... 2>&1 | tee log` and Ctrl-C: the terminal sends SIGINT to tee too, which ends, and the
run's next progress line goes into a pipe that nobody reads (BrokenPipeError). Such an error must not
end the run before it has saved its checkpoint, nor print a traceback (`lm eval --help | head -1`).
A SteadyStream wraps sys.stdout or sys.stderr: from its first BrokenPipeError on, what is written to
it goes to os.devnull (its file descriptor is pointed there, as the Python documentation advises, so
that the interpreter's own flush at exit succeeds too), and the command carries on. Other errors (a
full disk under a redirected stdout) still raise.
"""

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import TextIO


class SteadyStream:
    """A text stream's writes and flushes, a BrokenPipeError dropped (with all later output); the rest
    of the stream (fileno, isatty, encoding, ...) as it is."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self.to_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            self.to_devnull()

    def to_devnull(self) -> None:
        """Points the stream at os.devnull: its file descriptor where it has one (what the stream still
        holds in its buffer is then written there), else the stream itself is replaced."""
        try:
            descriptor = self.stream.fileno()
        except (OSError, ValueError):  # (io.UnsupportedOperation is both)
            self.stream = open(os.devnull, "w")  # (for the life of the process)
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, descriptor)
        os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def steady(stream: TextIO) -> TextIO:
    """stream as a SteadyStream (itself if it is one already)."""
    return stream if isinstance(stream, SteadyStream) else SteadyStream(stream)


def steady_streams() -> None:
    """Makes sys.stdout and sys.stderr SteadyStreams for the rest of the process (a command's start)."""
    sys.stdout, sys.stderr = steady(sys.stdout), steady(sys.stderr)


@contextlib.contextmanager
def steady_output() -> Iterator[None]:
    """sys.stdout and sys.stderr SteadyStreams for the block (lm.train.loop.train's, which a notebook or
    script may call); as they were after it."""
    saved = sys.stdout, sys.stderr
    steady_streams()
    try:
        yield
    finally:
        sys.stdout.flush()  # (through the SteadyStream: a reader gone meanwhile is no error here either)
        sys.stdout, sys.stderr = saved
