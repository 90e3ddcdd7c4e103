"""Peak FLOP/s per device, for model FLOPs utilisation (MFU); and the facts of a run that a scaling law is
fitted to (scale_facts: parameters without the embeddings, FLOPs per token, tokens seen).

MFU is reported only against a real peak: an accelerator's data sheet (KNOWN_PEAKS) or the user's
train.peak_flops. A CPU's peak depends on its cores, vector units and clock, which nothing here knows,
so its runs log no MFU (a 1024 x 1024 matmul's measured rate is no peak: models beat it by far).
"""

import functools
import math
import time

import jax
import jax.numpy as jnp

# Dense bf16 peaks from the vendors' data sheets, FLOP/s per device (chip, or GPU).
KNOWN_PEAKS = {
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v5": 459e12,
    "TPU v6 lite": 918e12,
    "TPU v6e": 918e12,
    "NVIDIA A100": 312e12,
    "NVIDIA H100": 989e12,
    "NVIDIA H200": 989e12,
    "NVIDIA B200": 2250e12,
}


@functools.cache
def measure_matmul_peak(size: int = 1024, repeats: int = 5, dtype=jnp.float32) -> float:
    """FLOP/s of a jitted size x size matmul on the default device: the best of `repeats` (measured once
    per process). A reference rate for benchmarks that print it as such, not a peak to divide by."""
    a = jnp.ones((size, size), dtype)
    matmul = jax.jit(lambda x, y: x @ y)
    matmul(a, a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a, a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def peak_flops_per_device(device: jax.Device | None = None) -> float | None:
    """The data-sheet peak of a known accelerator; None for anything else (a CPU): no MFU there."""
    device = device or jax.devices()[0]
    for kind, peak in sorted(KNOWN_PEAKS.items(), key=lambda kv: -len(kv[0])):
        if device.device_kind.startswith(kind):
            return peak
    return None


# Modules holding vocabulary or position tables: what Kaplan et al. (2020) leave out of a model's size N.
EMBEDDING_MODULES = ("token_embed", "position_embed", "segment_embed", "lm_head")


def non_embedding_params(params) -> int:
    """Parameters outside the token, segment and position tables and an untied output layer (the leaves under
    a module or param named in EMBEDDING_MODULES) of a param tree (arrays or ShapeDtypeStructs)."""
    return sum(math.prod(leaf.shape) for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
               if not any(getattr(key, "key", None) in EMBEDDING_MODULES for key in path))


def scale_facts(step: int, units_per_step: int, flops_per_step: float, unit: str) -> dict[str, float]:
    """What a run's summary.json records for scaling fits after `step` steps: the training units it has seen
    ('tokens_seen': step x batch x context for a language model), the training FLOPs per unit ('flops_per_token';
    forward and backward) and in all ('train_flops')."""
    one = unit.removesuffix("s")
    return {f"{unit}_seen": step * units_per_step,
            f"flops_per_{one}": flops_per_step / units_per_step,
            "train_flops": step * flops_per_step}
