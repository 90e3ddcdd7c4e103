"""Orbax checkpoints of the train state.

The data position needs no saving: every pipeline's global batch number s depends only on the seed
and s (see Experiment.train_data), so a run restored at step s reads on from batch s. That also
makes a checkpoint independent of the topology: the arrays are saved whole (each process writes its
shards) and restored into whatever shardings the new mesh gives them.
"""

import contextlib
import sys

import jax
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from lm.errors import UserError


def path_name(path) -> str:
    """'params/block_0/mlp/up/kernel' for a tree path, whether its keys are dict keys, attributes
    (dataclasses, named tuples) or indices: Orbax's metadata tree and the state differ in which."""
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


class Checkpointer:
    """Saves (asynchronously) and restores the train state in workdir/checkpoints. With several
    processes, every process calls every method: Orbax writes and reads collectively."""

    def __init__(self, directory: str, keep: int):
        """directory: an absolute local path, or a URL Orbax writes to (gs://...). Nothing is created
        before the first save makes the folder, so that a run a check stops leaves none behind."""
        folder = epath.Path(directory)
        self.manager = ocp.CheckpointManager(
            directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep, enable_async_checkpointing=True, create=False,
                # what a killed save left behind (never restored): none in a new or empty folder, which
                # a failed run may remove again (lm.train.setup.prepared_directory) while this runs
                cleanup_tmp_directories=folder.exists() and any(folder.iterdir()),
            ),
            item_handlers={"state": ocp.StandardCheckpointHandler()},
        )

    def check_compatible(self, abstract_state, step: int) -> None:
        """Raises IncompatibleCheckpoint when the checkpoint at step holds arrays of other shapes than this
        model's, naming the first."""
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

    def restore_checked(self, step: int, abstract_state):
        """The state at step, after the shape check; a checkpoint that cannot be read (damaged or
        truncated files) raises CorruptCheckpoint."""
        try:
            self.check_compatible(abstract_state, step)
            return self.restore(step, abstract_state)
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 (Orbax and TensorStore raise many kinds for unreadable files)
            raise CorruptCheckpoint(step, self.manager.directory, e) from e

    def restore_latest(self, abstract_state, fallback: bool) -> tuple[int, object] | None:
        """(step, state) of the latest checkpoint, or None when there is none. One that cannot be
        read is a UserError, unless fallback: then it is set aside (renamed '<step>.corrupt', kept
        for inspection) and the one before is tried."""
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                return step, self.restore_checked(step, abstract_state)
            except CorruptCheckpoint as e:
                if not fallback:
                    raise UserError(f"{e}; pass --config.train.restore_fallback=True to resume from the one "
                                    "before it (this one is kept, renamed), or move it out of the way") from e
                aside = self.manager.directory / f"{step}.corrupt"
                if jax.process_index() == 0:  # one process moves it; the others wait for that
                    (self.manager.directory / str(step)).rename(aside)
                multihost_utils.sync_global_devices(f"set aside checkpoint {step}")
                self.manager.reload()
                print(f"warning: {e}; moved it to {aside} and trying the one before", file=sys.stderr)
        return None

    def save(self, step: int, state) -> bool:
        """Saves now (the trainer decides when), in the background; a failure of the previous
        background save (a full disk, say) is raised here as a UserError."""
        with save_errors(self.manager.directory):
            return self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state)), force=True)

    def restore(self, step: int, abstract_state):
        """Returns the state at step, sharded as abstract_state (shapes with shardings) says."""
        items = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state))
        return self.manager.restore(step, args=items)["state"]

    def close(self) -> None:
        """Waits for the background save; its failure is raised as a UserError."""
        with save_errors(self.manager.directory):
            self.manager.wait_until_finished()
        self.manager.close()


class IncompatibleCheckpoint(UserError):
    """A checkpoint of another model: arrays of other shapes than this one's (lm.train.loop names the
    config fields that explain it, where the run's config.json has them)."""


class CorruptCheckpoint(Exception):
    """A checkpoint whose files cannot be read (as opposed to one of another model: a UserError)."""

    def __init__(self, step: int, directory, cause: Exception):
        reason = " ".join(str(cause).split())[:200]
        super().__init__(f"the checkpoint at step {step} in {directory} cannot be read ({type(cause).__name__}: "
                         f"{reason})")


def finished_steps(directory) -> list[int]:
    """The steps whose checkpoint was completely written: a write goes to a temporary folder that is
    renamed to the step number only when it is complete."""
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) if directory.exists() else []


def os_error_in(error: BaseException) -> BaseException:
    """The exception in error's chain that carries the operating system's reason (an OSError, or
    TensorStore's error text with an os_error_code), else the innermost one."""
    chain = [error]
    while (following := chain[-1].__cause__ or chain[-1].__context__) is not None and following not in chain:
        chain.append(following)
    for candidate in chain:
        if isinstance(candidate, OSError) or "os_error_code" in str(candidate) or "Errno" in str(candidate):
            return candidate
    return chain[-1]


@contextlib.contextmanager
def save_errors(directory):
    """Turns a failed checkpoint write into a one-line UserError that says what is still intact."""
    try:
        yield
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 (the write's OSError arrives wrapped in Orbax's own errors)
        cause = os_error_in(e)
        reason = " ".join(str(cause).split())
        reason = reason if len(reason) <= 240 else "..." + reason[-240:]  # the OS error comes last
        steps = finished_steps(directory)
        intact = f"the checkpoint at step {steps[-1]} is intact" if steps else "there is no earlier checkpoint"
        raise UserError(f"writing a checkpoint in {directory} failed ({type(cause).__name__}: {reason}); {intact}: "
                        "free some space (or fix the folder) and rerun the same command to resume") from e
