"""Orbax checkpoints of the train state together with the data iterator's position."""

import pathlib

import grain
import jax
import orbax.checkpoint as ocp

from lm.errors import UserError


def path_name(path) -> str:
    """'params/block_0/mlp/up/kernel' for a tree path, whether its keys are dict keys, attributes
    (dataclasses, named tuples) or indices: Orbax's metadata tree and the state differ in which."""
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


class Checkpointer:
    """Saves (asynchronously) and restores {state, data iterator} in workdir/checkpoints."""

    def __init__(self, directory: pathlib.Path, keep: int):
        self.manager = ocp.CheckpointManager(
            directory.absolute(),
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep, enable_async_checkpointing=True
            ),
            item_handlers={
                "state": ocp.StandardCheckpointHandler(),
                "data": grain.checkpoint.CheckpointHandler(),
            },
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

    def save(self, step: int, state, data_iterator) -> bool:
        """Saves now: the trainer decides when (so the data position always matches the step)."""
        return self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                data=grain.checkpoint.CheckpointSave(data_iterator),
            ),
            force=True,
        )

    def restore(self, step: int, abstract_state, data_iterator=None):
        """Returns the state (sharded as abstract_state says); data_iterator, if given, is set to
        its saved position in place."""
        items = {"state": ocp.args.StandardRestore(abstract_state)}
        if data_iterator is not None:
            items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
        return self.manager.restore(step, args=ocp.args.Composite(**items))["state"]

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
