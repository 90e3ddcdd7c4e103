"""One training run at a time in a workdir: an operating-system lock on a file in it.

`workdir_lock(workdir, process_index)` takes fcntl.flock on <workdir>/.lock.<process_index> without
waiting: when another process holds it, a UserError names the workdir and the holder (host, pid,
start time, which the holder writes into the file). The kernel releases the lock when its holder
exits in any way, SIGKILL and crashes included, so a lock file left behind never blocks the next
run (a run that ends removes its lock file). The processes of one multi-process run
(lm.distributed) share the workdir and run the same command: each takes the lock of its own
process index, so they never block each other, while a second run's process i finds the first
run's process i holding the same file.

On a shared filesystem the lock works where the filesystem supports flock (local disks; NFS, where
Linux maps it onto NFS byte-range locks); where it does not (some FUSE mounts) the run goes on
unlocked with a warning.
"""

import contextlib
import datetime
import errno
import fcntl
import os
import pathlib
import socket
import sys
from collections.abc import Callable, Iterator

from lm.errors import UserError


def lock_path(workdir: pathlib.Path, process_index: int) -> pathlib.Path:
    return workdir / f".lock.{process_index}"


def holder_description() -> str:
    """Who holds the lock, as the message of a process that finds it held shows it."""
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    return f"host {socket.gethostname()}, pid {os.getpid()}, started {started}"


@contextlib.contextmanager
def workdir_lock(workdir: pathlib.Path, process_index: int) -> Iterator[Callable[[], bool]]:
    """Holds the workdir's lock for process_index for the duration of the block; raises UserError
    at once (nothing else written) when another process holds it. The block gets a function that says
    whether the lock file is still in place (not when the workdir was removed, or replaced, meanwhile).
    On leaving, the lock file is removed (one a killed holder left behind stays, unlocked, and is taken
    over; so does one on a filesystem that has become read-only)."""
    path = lock_path(workdir, process_index)
    descriptor = take_lock(path, workdir)
    try:
        with contextlib.suppress(OSError):  # (a full disk: the run's next write says so; the file stays empty)
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, holder_description().encode() + b"\n", 0)
        yield lambda: still_named(path, descriptor)
    finally:
        with contextlib.suppress(OSError):  # before the lock goes: a process that then opens the path makes a new file
            path.unlink(missing_ok=True)
        os.close(descriptor)  # releases the lock


def take_lock(path: pathlib.Path, workdir: pathlib.Path) -> int:
    """An open descriptor of path, exclusively flock'ed; UserError when another process holds it."""
    while True:
        try:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by exec'd children
        except OSError as e:  # a damaged lock: a folder, a dangling link, ... (an unwritable workdir is checked first)
            raise UserError(f"{path}, the lock of {workdir}, cannot be opened ({e.strerror}): remove it (with "
                            "rm -r) once no lm train runs there") from None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 1024, 0).decode(errors="replace").strip() or "it is starting up"
            os.close(descriptor)
            raise UserError(
                f"{workdir} is in use by another training run ({holder}): wait for it to finish or stop it, "
                "or pass another --workdir"
            ) from None
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                os.close(descriptor)
                raise
            print(f"warning: cannot lock {path} ({e.strerror}); nothing stops a second run from using "
                  f"{workdir} at the same time", file=sys.stderr)
        if still_named(path, descriptor):
            return descriptor
        os.close(descriptor)  # its holder removed it on leaving, after this process opened it: again


def still_named(path: pathlib.Path, descriptor: int) -> bool:
    """Whether path still names the file that descriptor has open."""
    try:
        return os.stat(path).st_ino == os.fstat(descriptor).st_ino
    except FileNotFoundError:
        return False
