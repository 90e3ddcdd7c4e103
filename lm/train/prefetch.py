"""Loading the next global batches onto the devices while the current step runs (train.prefetch).

DevicePrefetcher(host_iterator, place_fn, size) is an iterator over place_fn(item) for the items of
host_iterator, in order: a background thread pulls the next host batch (the data pipeline, numpy)
and places it on the devices (sharding.assemble_batch) while the main thread runs the step, keeping
up to `size` placed batches ready in a bounded queue. The sequence is exactly that of the plain
loop, so runs stay bit-identical; size 0 is the plain loop, in the caller's thread.

An exception in the thread (a data error, a UserError) is raised again by the next __next__, as the
same exception object (type, message, traceback), once the batches before it have been taken; the
end of host_iterator is StopIteration there. close() (or leaving the `with` block) stops the thread,
also when it is blocked on a full queue, and drops the batches it had placed.

With several processes each prefetches its own rows: assemble_batch
(jax.make_array_from_process_local_data) is no collective, so placing from a thread cannot
deadlock the processes.
"""

import queue
import threading
from collections.abc import Callable, Iterable
from typing import Any

_ITEM, _END, _ERROR = "item", "end", "error"


class DevicePrefetcher:
    """place_fn(item) for each item of host_iterator, up to `size` of them ready ahead (0: none,
    computed on demand in the caller's thread)."""

    POLL_SECONDS = 0.1  # how often a thread blocked on a full queue checks whether it was closed

    def __init__(self, host_iterator: Iterable, place_fn: Callable[[Any], Any], size: int, join_seconds: float = 10.0):
        if size < 0:
            raise ValueError(f"prefetch size {size} < 0")
        self._host = iter(host_iterator)
        self._place = place_fn
        self.size = size
        self._join_seconds = join_seconds
        self._closed = False
        self._final: tuple[str, BaseException | None] | None = None  # the end or error, once reached
        self._thread = None
        if size:
            self._queue: queue.Queue = queue.Queue(maxsize=size)
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._produce, name="device-prefetch", daemon=True)
            self._thread.start()

    def _produce(self) -> None:
        try:
            while not self._stop.is_set():  # checked before each read: once closed, nothing more is read
                try:
                    item = next(self._host)
                except StopIteration:
                    self._put((_END, None))
                    return
                if not self._put((_ITEM, self._place(item))):
                    return
        except BaseException as e:  # every error goes to the consumer
            self._put((_ERROR, e))

    def _put(self, entry) -> bool:
        """Puts entry once there is room; False (dropped) if closed first."""
        while not self._stop.is_set():
            try:
                self._queue.put(entry, timeout=self.POLL_SECONDS)
                return True
            except queue.Full:
                pass
        return False

    def __iter__(self) -> "DevicePrefetcher":
        return self

    def __next__(self):
        if self._closed:
            raise RuntimeError("DevicePrefetcher used after close()")
        if not self.size:
            return self._place(next(self._host))
        if self._final is None:
            kind, value = self._get()
            if kind == _ITEM:
                return value
            self._final = (kind, value)
        kind, error = self._final
        if kind == _END:
            raise StopIteration
        raise error

    def _get(self):
        while True:
            try:
                return self._queue.get(timeout=1.0)
            except queue.Empty:
                if not self._thread.is_alive():  # it always queues an end or error first; in case
                    try:
                        return self._queue.get_nowait()
                    except queue.Empty:
                        return _ERROR, RuntimeError("the prefetch thread ended without a batch or an error")

    def close(self) -> None:
        """Stops the thread (waiting up to join_seconds for a batch it is loading or placing) and
        drops the batches it had queued. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._thread is None:
            return
        self._stop.set()
        self._drain()
        self._thread.join(self._join_seconds)
        self._drain()  # a batch it queued while we waited

    def _drain(self) -> None:
        try:
            while True:
                self._queue.get_nowait()
        except queue.Empty:
            pass

    def __enter__(self) -> "DevicePrefetcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
