"""XLA flags that pay on a GPU, set by the `lm` command before jax starts a backend.

XLA reads $XLA_FLAGS once, when the process's first backend starts, so the command adds its defaults to the
environment before it imports the command's module (lm/cli/__init__.py). Each default is added only where the
GPU will run the program (`platform()`: $JAX_PLATFORMS, else an installed GPU plugin of jax) and only unless
$XLA_FLAGS already sets that flag: the user's value wins. Every flag exists in the XLA of jax 0.8 and later.

  --xla_gpu_enable_latency_hiding_scheduler=true   schedules collectives (all-reduce, all-gather, ...) early and
                                                   overlaps them with compute; off in XLA by default (JAX's GPU
                                                   performance guide, MaxText and NVIDIA's JAX images turn it on)
  --xla_gpu_enable_pipelined_all_gather=true       inside a while loop (scanned layers), starts the next
  --xla_gpu_enable_pipelined_all_reduce=true       iteration's all-gather / all-reduce during this one (FSDP,
                                                   data parallel; MaxText's GPU set; reduce-scatter is already)
Left at XLA's defaults: Triton GEMMs (on, autotuned against cuBLAS per matmul, so each takes the faster) and
command buffers (CUDA graphs of fusions, cuBLAS, cuDNN and custom calls: on).
"""

import os
import pkgutil

GPU_FLAGS = (
    "--xla_gpu_enable_latency_hiding_scheduler=true",
    "--xla_gpu_enable_pipelined_all_gather=true",
    "--xla_gpu_enable_pipelined_all_reduce=true",
)
GPU_PLATFORMS = ("cuda", "rocm", "gpu")  # $JAX_PLATFORMS names of a GPU
GPU_PLUGINS = ("xla_cuda", "xla_rocm")  # the modules jax's GPU plugins install under the jax_plugins package


def flag_name(entry: str) -> str:
    """'--xla_gpu_x=true' -> 'xla_gpu_x' (also for '--xla_gpu_x' and '-xla_gpu_x=1')."""
    return entry.lstrip("-").split("=", 1)[0]


def composed_flags(platform: str, existing: str) -> str:
    """$XLA_FLAGS for a process on platform ('gpu', 'cpu', 'tpu'): existing, then each GPU default whose flag
    existing does not set (on a GPU; elsewhere existing unchanged)."""
    if platform != "gpu":
        return existing
    given = {flag_name(entry) for entry in existing.split()}
    added = [flag for flag in GPU_FLAGS if flag_name(flag) not in given]
    return " ".join([existing.strip(), *added]).strip()


def platform() -> str:
    """The platform jax will start on, without starting it: the first of $JAX_PLATFORMS ('gpu' for cuda or
    rocm) where set, else 'gpu' where a GPU plugin of jax is installed, else 'other' (a CPU or a TPU)."""
    chosen = os.environ.get("JAX_PLATFORMS", "").split(",")[0].strip().lower()
    if chosen:
        return "gpu" if chosen in GPU_PLATFORMS else chosen
    try:
        import jax_plugins  # the namespace package of jax's plugins (absent where none is installed)
    except ImportError:
        return "other"
    plugins = [module.name for module in pkgutil.iter_modules(jax_plugins.__path__)]
    return "gpu" if any(name.startswith(GPU_PLUGINS) for name in plugins) else "other"


def set_default_flags() -> None:
    """Adds the defaults for this process's platform to $XLA_FLAGS: call before jax starts a backend."""
    flags = composed_flags(platform(), os.environ.get("XLA_FLAGS", ""))
    if flags:
        os.environ["XLA_FLAGS"] = flags
