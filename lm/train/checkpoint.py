"""Orbax checkpoints of the train state.

The data position needs no saving: every pipeline's global batch number s depends only on the seed
and s (see Experiment.train_data), so a run restored at step s reads on from batch s. That also
makes a checkpoint independent of the topology: the arrays are saved whole (each process writes its
shards) and restored into whatever shardings the new mesh gives them.

Each checkpoint of a single-process run also records a CRC-32 of every array (checksums.json in the
step's folder, written once Orbax has finished the step; computed by a thread on the host copy taken
when the save starts), and a restore compares them: a damaged file that still decodes is caught too.
A checkpoint without the file (saved before checksums were added, or by several processes, each of
which holds only its shards) is restored unverified. The same thread notes whether the saved state
is all finite, so that a NaN stop names the newest checkpoint worth resuming from.

A run whose optimizer leaves some parameters frozen (LoRA's base weights: lm.train.optim.trainable) saves
them once, in the folder FROZEN_DIR beside the steps, at its first checkpoint; every step's checkpoint then
holds the rest of the state alone (step, adapters, optimizer state), and a restore puts the two together,
so a resume is exact and needs nothing outside the checkpoints.
"""

import concurrent.futures
import contextlib
import errno
import gc
import itertools
import json
import os
import re
import sys
import time
import warnings
import zlib

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import traverse_util
from jax.experimental import multihost_utils

from lm.errors import UserError
from lm.train.optim import trainable
from lm.train.state import TrainState


def path_name(path) -> str:
    """'params/block_0/mlp/up/kernel' for a tree path, whether its keys are dict keys, attributes
    (dataclasses, named tuples) or indices: Orbax's metadata tree and the state differ in which."""
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


CHECKSUMS_FILE = "checksums.json"
FROZEN_DIR = "frozen"  # beside the steps' folders: the frozen parameters, saved once (see the module docstring)


def split_frozen(state) -> tuple[object, dict]:
    """(a TrainState with the parameters the optimizer updates alone, the frozen parameters: a nested dict, empty
    where every parameter trains, or state is no TrainState)."""
    if not isinstance(state, TrainState):
        return state, {}
    flat = traverse_util.flatten_dict(state.params)
    train = traverse_util.flatten_dict(trainable(state.params))

    def picked(keep: bool) -> dict:
        return traverse_util.unflatten_dict({name: value for name, value in flat.items() if train[name] == keep})

    return state.replace(params=picked(True)), picked(False)


def with_frozen(state, frozen: dict):
    """The inverse of split_frozen: state with the frozen parameters put back."""
    return state.replace(params=merge_trees(state.params, frozen))


def merge_trees(tree: dict, added: dict) -> dict:
    """tree (nested dicts) with added's leaves put in."""
    return traverse_util.unflatten_dict({**traverse_util.flatten_dict(tree), **traverse_util.flatten_dict(added)})


def frozen_checkpointer() -> ocp.Checkpointer:
    return ocp.Checkpointer(ocp.StandardCheckpointHandler())


def host_copy(state) -> dict[str, list[np.ndarray]]:
    """Array path name -> this process's copy of it on the host: [the whole array] in a single-process
    run; with several processes, the shards this process holds (one replica of each)."""
    if jax.process_count() == 1:
        return {path_name(path): [np.asarray(leaf)]
                for path, leaf in jax.tree_util.tree_leaves_with_path(jax.device_get(state))}
    return {path_name(path): [np.asarray(shard.data) for shard in leaf.addressable_shards if shard.replica_id == 0]
            for path, leaf in jax.tree_util.tree_leaves_with_path(state)}


def checksums(copy: dict[str, list[np.ndarray]]) -> dict[str, str]:
    """Array path name -> CRC-32 (8 hex digits) of its bytes, for a single-process host_copy."""
    return {name: f"{zlib.crc32(np.ascontiguousarray(whole).reshape(-1).view(np.uint8)):08x}"
            for name, (whole,) in copy.items()}


def all_finite(copy: dict[str, list[np.ndarray]]) -> bool:
    """Whether every value of a host_copy is finite (no NaN/Inf; integer arrays always are)."""
    return all(np.isfinite(piece).all() for pieces in copy.values() for piece in pieces
               if np.issubdtype(piece.dtype, np.inexact))


WAIT_AFTER_FAILURE_SECONDS = 60  # how long a run that failed waits for a checkpoint still being written


class Checkpointer:
    """Saves (asynchronously) and restores the train state in workdir/checkpoints. With several
    processes, every process calls every method: Orbax writes and reads collectively. A context
    manager: closed on leaving the block (after an error in it, as __exit__ says)."""

    def __init__(self, directory: str, keep: int, keep_steps: tuple[int, ...] = ()):
        """directory: an absolute local path, or a URL Orbax writes to (gs://...). Nothing is created
        before the first save makes the folder, so that a run a check stops leaves none behind. The keep
        latest checkpoints are kept, and those of keep_steps besides (a WSD run's last stable step)."""
        folder = epath.Path(directory)
        kept = ocp.checkpoint_managers.AnyPreservationPolicy(
            [ocp.checkpoint_managers.LatestN(n=keep), ocp.checkpoint_managers.CustomSteps(keep_steps)])
        self.manager = ocp.CheckpointManager(
            directory,
            options=ocp.CheckpointManagerOptions(
                preservation_policy=kept, enable_async_checkpointing=True, create=False,
                # what a killed save left behind (never restored): none in a new or empty folder, which
                # a failed run may remove again (lm.train.setup.prepared_directory) while this runs
                cleanup_tmp_directories=folder.exists() and any(folder.iterdir()),
            ),
            item_handlers={"state": ocp.StandardCheckpointHandler()},
        )
        self.hasher = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="checksums")
        self.pending: tuple[int, concurrent.futures.Future] | None = None  # (step, its checksums) being saved
        self.finite: dict[int, concurrent.futures.Future | bool] = {}  # step saved or restored here -> all_finite

    def check_compatible(self, abstract_state, step: int) -> None:
        """Raises IncompatibleCheckpoint when the checkpoint at step (with the frozen parameters) holds arrays of
        other shapes than this model's, naming the first."""
        abstract_state, frozen = split_frozen(abstract_state)
        if frozen:
            self.check_frozen(frozen, step)
        saved = self.manager.item_metadata(step)["state"]
        saved_shapes = {path_name(path): tuple(leaf.shape) for path, leaf in jax.tree_util.tree_leaves_with_path(saved)}
        for path, leaf in jax.tree_util.tree_leaves_with_path(abstract_state):
            name = path_name(path)
            if saved_shapes.get(name) != tuple(leaf.shape):
                found = saved_shapes.get(name, "nothing")
                raise IncompatibleCheckpoint(
                    f"the checkpoint at step {step} in {self.manager.directory} does not fit this "
                    f"model: {name} is {found} there but {tuple(leaf.shape)} here; use a new "
                    "--workdir or the config that wrote this one"
                )
        if len(saved_shapes) != len(jax.tree.leaves(abstract_state)):
            raise IncompatibleCheckpoint(
                f"the checkpoint at step {step} in {self.manager.directory} holds "
                f"{len(saved_shapes)} arrays but this model's state has "
                f"{len(jax.tree.leaves(abstract_state))}; use a new --workdir"
            )

    def check_frozen(self, frozen: dict, step: int) -> None:
        folder = self.manager.directory / FROZEN_DIR
        if not folder.exists():
            raise IncompatibleCheckpoint(f"the checkpoint at step {step} in {self.manager.directory} holds no frozen "
                                         f"parameters ({folder} is missing), which this model has; use a new "
                                         "--workdir or the config that wrote this one")
        saved = {path_name(path): tuple(leaf.shape) for path, leaf in
                 jax.tree_util.tree_leaves_with_path(frozen_checkpointer().metadata(folder).item_metadata)}
        for path, leaf in jax.tree_util.tree_leaves_with_path(frozen):
            if saved.get(path_name(path)) != tuple(leaf.shape):
                raise IncompatibleCheckpoint(
                    f"the frozen parameters in {folder} do not fit this model: {path_name(path)} is "
                    f"{saved.get(path_name(path), 'nothing')} there but {tuple(leaf.shape)} here; use a new --workdir "
                    "or the config that wrote them")

    def restore_checked(self, step: int, abstract_state):
        """The state at step, after the shape check; a checkpoint that cannot be read (damaged or
        truncated files) raises CorruptCheckpoint."""
        try:
            self.check_compatible(abstract_state, step)
            with quiet_failed_reads():
                state = self.restore(step, abstract_state)
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 (Orbax and TensorStore raise many kinds for unreadable files)
            reason = f"cannot be read ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
            raise CorruptCheckpoint(step, self.manager.directory, reason) from e
        copy = host_copy(split_frozen(state)[0])  # what the step's folder holds
        self.verify(step, copy)
        self.finite[step] = all_finite(copy)
        return state

    def verify(self, step: int, copy: dict[str, list[np.ndarray]]) -> None:
        """Raises CorruptCheckpoint naming the first array of the restored state (its host_copy) whose
        CRC-32 differs from the one recorded at save time; nothing to compare without checksums.json
        or with several processes (each holds only its shards)."""
        file = self.manager.directory / str(step) / CHECKSUMS_FILE
        if jax.process_count() > 1 or not file.exists():
            return
        try:
            recorded = json.loads(file.read_text())
        except (OSError, ValueError) as e:
            raise CorruptCheckpoint(step, self.manager.directory, f"has a damaged {CHECKSUMS_FILE} ({e})") from e
        for name, checksum in checksums(copy).items():
            if recorded.get(name) != checksum:
                raise CorruptCheckpoint(step, self.manager.directory, f"is damaged: the array {name} does not "
                                        "match the checksum recorded when it was saved")

    def restore_latest(self, abstract_state, fallback: bool, at_most: int | None = None) -> tuple[int, object] | None:
        """(step, state) of the latest checkpoint (the latest up to step at_most, where given), or None when there
        is none. One that cannot be read or fails its checksums is a UserError, unless fallback: then it is set
        aside (renamed '<step>.corrupt', kept for inspection: set_aside_path), said in a warning once an earlier
        one restores, and the one before is tried. With none left (or only set-aside ones) it is a UserError too: a
        run starts again from step 0 only once the user has deleted the checkpoints."""
        set_aside_warnings = []
        for step in sorted(self.manager.all_steps(), reverse=True):
            if at_most is not None and step > at_most:
                continue
            try:
                restored = step, self.restore_checked(step, abstract_state)
            except CorruptCheckpoint as e:
                if not fallback:
                    raise UserError(f"{e}; pass --config.train.restore_fallback=True to resume from the one "
                                    "before it (this one is kept, renamed), or move it out of the way") from e
                multihost_utils.sync_global_devices(f"name checkpoint {step} set aside")  # (all see one name)
                aside = set_aside_path(self.manager.directory, step)
                if jax.process_index() == 0:  # one process moves it; the others wait for that
                    (self.manager.directory / str(step)).rename(aside)
                multihost_utils.sync_global_devices(f"set aside checkpoint {step}")
                self.manager.reload()
                set_aside_warnings.append(f"warning: {e}; moved it to {aside}")
                continue
            for warning in set_aside_warnings:
                print(f"{warning}; resuming from step {step}", file=sys.stderr)
            return restored
        set_aside = sorted(p.name for p in self.manager.directory.iterdir() if SET_ASIDE.fullmatch(p.name)) \
            if self.manager.directory.exists() else []
        if set_aside:
            raise UserError(f"no checkpoint in {self.manager.directory} can be restored (damaged ones set aside: "
                            f"{', '.join(set_aside)}); to train from step 0, delete {self.manager.directory} "
                            "(or pass another --workdir)")
        return None

    def discard_after(self, step: int) -> list[int]:
        """Deletes the checkpoints after step (a run that goes on from step replaces them); returns their steps."""
        newer = sorted(later for later in self.manager.all_steps() if later > step)
        for later in newer:
            self.manager.delete(later)
        return newer

    def save(self, step: int, state) -> bool:
        """Saves now (the trainer decides when), in the background; a failure of the previous
        background save (a full disk, say) is raised here as a UserError. Meanwhile a thread checks
        that the state is finite and computes the arrays' checksums (single-process runs), written once
        the save has finished."""
        with save_errors(self.manager.directory):
            self.manager.wait_until_finished()
            self.write_checksums()
            state, frozen = split_frozen(state)
            if frozen and self.manager.latest_step() is None:  # the run's first checkpoint: its frozen parameters
                frozen_checkpointer().save(self.manager.directory / FROZEN_DIR, args=ocp.args.StandardSave(frozen),
                                           force=True)
            copy = host_copy(state)
            saved = self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state)), force=True)
            self.finite[step] = self.hasher.submit(all_finite, copy)
            if jax.process_count() == 1:
                self.pending = step, self.hasher.submit(checksums, copy)
            return saved

    def write_checksums(self) -> None:
        """Writes the checksums of the last save (which must have finished) into its step's folder,
        atomically (a temporary file renamed)."""
        if self.pending is None:
            return
        (step, computed), self.pending = self.pending, None
        folder = self.manager.directory / str(step)
        temporary = folder / f"{CHECKSUMS_FILE}.tmp"
        temporary.write_text(json.dumps(computed.result(), indent=0))
        temporary.rename(folder / CHECKSUMS_FILE)

    def last_finite_step(self) -> int | None:
        """The newest step saved or restored by this checkpointer whose state (parameters, optimizer
        state) is all finite, in every process (a collective: every process calls it)."""
        steps = sorted(self.finite)
        flags = np.array([flag if isinstance(flag, bool) else flag.result() for flag in map(self.finite.get, steps)])
        if jax.process_count() > 1:
            flags = multihost_utils.process_allgather(flags).all(axis=0)
        return max((step for step, flag in zip(steps, flags, strict=True) if flag), default=None)

    def restore(self, step: int, abstract_state):
        """Returns the state at step (with the frozen parameters), sharded as abstract_state (shapes with
        shardings) says."""
        abstract_state, frozen = split_frozen(abstract_state)
        items = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state))
        state = self.manager.restore(step, args=items)["state"]
        if not frozen:
            return state
        return with_frozen(state, frozen_checkpointer().restore(self.manager.directory / FROZEN_DIR,
                                                                args=ocp.args.StandardRestore(frozen)))

    def close(self, wait_seconds: float | None = None) -> None:
        """Waits for the background save and writes its checksums, then ends Orbax's threads; a failure of
        the save is raised as a UserError. With wait_seconds (a run that has failed already), a save still
        running after that long (stuck on a hung filesystem) is a UserError too, its threads left running:
        lm train exits without waiting for them."""
        deadline = None if wait_seconds is None else time.monotonic() + wait_seconds
        while deadline is not None and self.manager.is_saving_in_progress():
            if time.monotonic() > deadline:
                self.hasher.shutdown(wait=False)
                raise UserError(f"writing a checkpoint in {self.manager.directory} did not end within "
                                f"{wait_seconds:g} s")
            time.sleep(0.05)
        try:
            with save_errors(self.manager.directory):
                self.manager.wait_until_finished()
                self.write_checksums()
        finally:
            self.manager.close()
            self.hasher.shutdown()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        """close(); after an error in the block, the error to report (a full disk, say), a failure of
        the save still running is dropped and the wait for it bounded (WAIT_AFTER_FAILURE_SECONDS)."""
        if error is None:
            self.close()
            return
        with contextlib.suppress(Exception):
            self.close(WAIT_AFTER_FAILURE_SECONDS)


class IncompatibleCheckpoint(UserError):
    """A checkpoint of another model: arrays of other shapes than this one's (lm.train.loop names the
    config fields that explain it, where the run's config.json has them)."""


class CorruptCheckpoint(UserError):
    """A checkpoint whose files cannot be read or do not match their checksums: one line where a
    single step is asked for (lm eval --step); restore_latest adds how to fall back from it."""

    def __init__(self, step: int, directory, reason: str):
        super().__init__(f"the checkpoint at step {step} in {directory} {reason}")


SET_ASIDE = re.compile(r"\d+\.corrupt(\.\d+)?")  # the name of a checkpoint a restore set aside (set_aside_path)


def set_aside_path(directory, step: int):
    """Where the damaged checkpoint at step goes: directory/'<step>.corrupt', or '<step>.corrupt.1', '.2', ...
    when an earlier fallback set one of that step aside already (the run trained to that step again since)."""
    names = (f"{step}.corrupt{f'.{n}' if n else ''}" for n in itertools.count())
    return next(directory / name for name in names if not (directory / name).exists())


def finished_steps(directory) -> list[int]:
    """The steps whose checkpoint was completely written: a write goes to a temporary folder that is
    renamed to the step number only when it is complete."""
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) if directory.exists() else []


def os_error_in(error: BaseException) -> BaseException:
    """The exception in error's chain that carries the operating system's reason (error_number finds
    one), else the innermost one."""
    chain = [error]
    while (following := chain[-1].__cause__ or chain[-1].__context__) is not None and following not in chain:
        chain.append(following)
    return next((candidate for candidate in chain if error_number(candidate) is not None), chain[-1])


@contextlib.contextmanager
def quiet_failed_reads():
    """Silences most of what Orbax's reads of an unreadable checkpoint print besides raising (pages
    of tracebacks; restore_checked says it in one line): the errors of TensorStore's callbacks into
    a closed event loop that pass through sys.excepthook, and of read coroutines never awaited
    (collected before it ends)."""
    hooks = sys.excepthook, sys.unraisablehook
    sys.excepthook = sys.unraisablehook = lambda *args: None
    try:
        yield
    finally:
        gc.collect()
        sys.excepthook, sys.unraisablehook = hooks


def quiet_failed_writes() -> None:
    """From now on, drops what the writes of a failed save print besides raising (save_errors reports
    the failure, in one line): the errors of TensorStore's callbacks into the save's event loop once it
    is closed (RuntimeError: Event loop is closed, with its traceback, many times over, through
    sys.unraisablehook; other errors still reach the hook), and the warnings about its write coroutines
    never awaited (at exit)."""
    warnings.filterwarnings("ignore", "coroutine .* was never awaited", RuntimeWarning)
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if not (unraisable.exc_type is RuntimeError and str(unraisable.exc_value) == "Event loop is closed"):
            previous(unraisable)

    sys.unraisablehook = hook


def error_number(error: BaseException) -> int | None:
    """The operating system's error number of an OSError, or in the text of another error: TensorStore's
    (os_error_code='28'; NOT_FOUND, a file or folder removed while it wrote), a Rust library's (Hugging
    Face tokenizers: 'os error 28'), an [Errno 28] quoted; else None."""
    if isinstance(error, OSError) and error.errno is not None:
        return error.errno
    text = str(error)
    found = re.search(r"os_error_code='?(\d+)|\(os error (\d+)\)|\[Errno (\d+)\]", text)
    if found:
        return int(next(filter(None, found.groups())))
    return errno.ENOENT if text.startswith("NOT_FOUND: ") else None


# What to do about a write into {folder} that failed with an error number.
REMEDIES = {
    errno.ENOSPC: "free some space on the disk of {folder}",
    errno.EDQUOT: "free some space on the disk of {folder} (or raise your disk quota)",
    errno.EFBIG: "free some space on the disk of {folder} (or raise the limit on file sizes: ulimit -f)",
    errno.EROFS: "make {folder} writable again (its filesystem is read-only)",
    errno.EACCES: "make {folder} writable again",
    errno.EPERM: "make {folder} writable again",
    errno.ENOENT: "restore {folder} (or let the rerun make it again)",
}


def write_failed(what: str, error: BaseException, folder, checkpoints) -> UserError:
    """The one line for a write into a run's folders that failed (a full disk, a read-only or removed
    folder): `what` failed, the operating system's reason (from error's chain), the newest complete
    checkpoint in checkpoints (a failed save leaves it as it was: Orbax writes a temporary folder that
    is renamed when complete), and what to do about folder (REMEDIES), then rerun to resume."""
    cause = os_error_in(error)
    number, text = error_number(cause), " ".join(str(cause).split())
    if number is not None:  # (the rest of such an error's text is a library's long account of where)
        reason = getattr(cause, "strerror", None) or os.strerror(number)
    else:
        reason = f"{type(cause).__name__}: {text if len(text) <= 240 else '...' + text[-240:]}"
    remedy = REMEDIES.get(number, "fix {folder}").format(folder=folder)
    steps = finished_steps(epath.Path(checkpoints))
    then = (f"the checkpoint at step {steps[-1]} is intact: {remedy}, then rerun the same command to resume"
            if steps else f"no checkpoint is left in {checkpoints}: {remedy}, then rerun the same command")
    return UserError(f"{what} failed ({reason}); {then}")


@contextlib.contextmanager
def save_errors(directory):
    """Turns a failed checkpoint write into a one-line UserError that says what is still intact
    (write_failed)."""
    try:
        yield
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 (the write's OSError arrives wrapped in Orbax's own errors)
        raise write_failed(f"writing a checkpoint in {directory}", e, directory, directory) from e
