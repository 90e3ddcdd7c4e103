"""Orbax checkpoints of the train state.

The data position needs no saving: every pipeline's global batch number s depends only on the seed
and s (see Experiment.train_data), so a run restored at step s reads on from batch s. That also
makes a checkpoint independent of the topology: the arrays are saved whole (each process writes its
shards) and restored into whatever shardings the new mesh gives them.
"""

import jax
import orbax.checkpoint as ocp

from lm.errors import UserError


def path_name(path) -> str:
    """'params/block_0/mlp/up/kernel' for a tree path, whether its keys are dict keys, attributes
    (dataclasses, named tuples) or indices: Orbax's metadata tree and the state differ in which."""
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


class Checkpointer:
    """Saves (asynchronously) and restores the train state in workdir/checkpoints. With several
    processes, every process calls every method: Orbax writes and reads collectively."""

    def __init__(self, directory: str, keep: int):
        """directory: an absolute local path, or a URL Orbax writes to (gs://...)."""
        self.manager = ocp.CheckpointManager(
            directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep, enable_async_checkpointing=True,
                cleanup_tmp_directories=True,  # what a killed save left behind (never restored)
            ),
            item_handlers={"state": ocp.StandardCheckpointHandler()},
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def check_compatible(self, abstract_state) -> None:
        """Raises UserError when the latest checkpoint's arrays differ in shape from this model's."""
        step = self.latest_step()
        if step is None:
            return
        saved = self.manager.item_metadata(step)["state"]
        saved_shapes = {path_name(path): tuple(leaf.shape) for path, leaf in jax.tree_util.tree_leaves_with_path(saved)}
        for path, leaf in jax.tree_util.tree_leaves_with_path(abstract_state):
            name = path_name(path)
            if saved_shapes.get(name) != tuple(leaf.shape):
                found = saved_shapes.get(name, "nothing")
                raise UserError(
                    f"the checkpoint at step {step} in {self.manager.directory} does not fit this "
                    f"model: {name} is {found} there but {tuple(leaf.shape)} here; use a new "
                    "--workdir or the config that wrote this one"
                )
        if len(saved_shapes) != len(jax.tree.leaves(abstract_state)):
            raise UserError(
                f"the checkpoint at step {step} in {self.manager.directory} holds "
                f"{len(saved_shapes)} arrays but this model's state has "
                f"{len(jax.tree.leaves(abstract_state))}; use a new --workdir"
            )

    def save(self, step: int, state) -> bool:
        """Saves now: the trainer decides when."""
        return self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state)), force=True)

    def restore(self, step: int, abstract_state):
        """Returns the state at step, sharded as abstract_state (shapes with shardings) says."""
        items = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state))
        return self.manager.restore(step, args=items)["state"]

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
