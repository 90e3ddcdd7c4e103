"""CPU devices: one single-threaded XLA device per core.

For models as small as the CPU configs, XLA's intra-op threading gains almost nothing (each
matmul is too small to split well), while running the batch data-parallel over one device per
core, each on its own thread, nearly doubles throughput on 2 cores (see README results). The
flags only change the CPU backend, so this is harmless on GPU/TPU hosts, and must run before jax
is imported. An XLA_FLAGS that already sets a CPU device count is left alone.
"""

import os

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def device_count_for(batch_size: int, cores: int) -> int:
    """The most devices, at most one per core, that evenly split the batch."""
    return max(d for d in range(1, cores + 1) if batch_size % d == 0)


def configure_cpu_devices(batch_size: int, cores: int | None = None) -> int:
    """Sets XLA_FLAGS for one single-threaded CPU device per core (as many as split batch_size);
    returns the device count, or 0 if XLA_FLAGS already chose one."""
    flags = os.environ.get("XLA_FLAGS", "")
    if DEVICE_COUNT_FLAG in flags:
        return 0
    count = device_count_for(batch_size, available_cores() if cores is None else cores)
    if count > 1:
        flags += f" {DEVICE_COUNT_FLAG}={count} --xla_cpu_multi_thread_eigen=false"
        os.environ["XLA_FLAGS"] = flags.strip()
    return count
