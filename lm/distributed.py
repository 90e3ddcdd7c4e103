"""Multi-process start-up: jax.distributed on TPU pods, GPU clusters and several processes on one host.

Every process runs the same `lm train ...` command. Before jax touches a device,
`initialize` decides whether this process is one of several:
  - flags (or the JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID environment) name
    the coordinator, the process count and this process's id: a plain multi-node launch;
  - otherwise a launcher that JAX recognises (a TPU pod slice, SLURM, Open MPI) started more than
    one process: JAX reads the coordinator and the ids from that environment;
  - otherwise this is the only process and nothing is initialised, so a laptop, a single GPU box or
    a one-host TPU VM never opens a coordinator port by accident.
"""

import os

import jax
from jax.experimental import multihost_utils

from lm.errors import UserError

EXPLICIT_ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def detected_launcher() -> tuple[str, int] | None:
    """(name, process count) of the multi-process launcher JAX detects here (SLURM, Open MPI, a
    Cloud TPU slice, ...), or None. Uses the detection jax.distributed.initialize() itself runs."""
    from jax._src import clusters  # JAX's cluster environments; no public API lists them

    for env in clusters.ClusterEnv._cluster_types:
        if not env.opt_in_only_method and env.is_env_present():
            return env.__name__, int(env.get_process_count())
    return None


def env_int(name: str) -> int | None:
    text = os.environ.get(name, "")
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise UserError(f"environment variable {name}={text!r} is not an integer") from None


def explicit_settings(
    coordinator_address: str | None, num_processes: int | None, process_id: int | None
) -> tuple[str, int, int] | None:
    """The coordinator, process count and id from flags, else the environment; None if none is set.
    A partial setting is an error (one process waiting for a coordinator that never comes)."""
    coordinator_address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS") or None
    num_processes = env_int("JAX_NUM_PROCESSES") if num_processes is None else num_processes
    process_id = env_int("JAX_PROCESS_ID") if process_id is None else process_id
    given = (coordinator_address, num_processes, process_id)
    if all(v is None for v in given):
        return None
    if any(v is None for v in given):
        raise UserError(
            "a multi-process run needs all of --coordinator_address, --num_processes and --process_id "
            f"(got {coordinator_address!r}, {num_processes!r}, {process_id!r})"
        )
    if not 0 <= process_id < num_processes:
        raise UserError(f"--process_id={process_id} is not in [0, --num_processes={num_processes})")
    return coordinator_address, num_processes, process_id


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> str | None:
    """Starts jax.distributed when this is one of several processes (see the module docstring) and
    says which one this is; None for a single process. Call before anything touches a jax device."""
    explicit = explicit_settings(coordinator_address, num_processes, process_id)
    if explicit is not None:
        address, count, index = explicit
        if count == 1:
            return None
        jax.distributed.initialize(address, count, index)
        return f"process {index} of {count}, coordinator {address}"
    launcher = detected_launcher()
    if launcher is None or launcher[1] <= 1:
        return None
    jax.distributed.initialize()
    return f"process {jax.process_index()} of {jax.process_count()} ({launcher[0]})"


def is_primary() -> bool:
    """Process 0 writes the files every process could write (logs, results, plots)."""
    return jax.process_index() == 0


def host_local(tree):
    """tree, with arrays this process can compute with on its own: as it is with one process; with
    several, each array gathered whole into host memory (so sampling and decoding after training
    run locally on every process, not as collectives)."""
    return tree if jax.process_count() == 1 else multihost_utils.process_allgather(tree, tiled=True)
