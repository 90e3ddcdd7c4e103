"""The train state: a pytree of step, params and optimizer state (sharded, checkpointed whole)."""

import flax.struct
import jax
import optax


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: dict
    opt_state: optax.OptState
