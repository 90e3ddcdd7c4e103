"""Benchmark: is the CIFAR-10 data pipeline the bottleneck of ViT training?

  python benchmarks/vit_cifar10.py [--config=configs/vit_cifar10.py:cpu] [--steps=50] [--batches=50]
      [--config.data.num_workers=2 --config.data.randaugment_ops=2 ...]

Prints side by side, in one run:
  pipeline   images/s of the Grain training pipeline alone (augmentation included), batches drawn as fast
             as it gives them, nothing else running;
  train step images/s of the jitted train step alone, on one prepared batch over and over;
  together   images/s of train steps fed by the pipeline (the trainer's situation).
If the pipeline alone is not well above the train step, augmentation limits training: add workers
(data.num_workers) or lighter augmentation. Compile time is excluded; the first batches are warm-up.
"""

import pathlib
import time

import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

from lm.cpu import keep_freed_memory

_CONFIG = config_flags.DEFINE_config_file(
    "config", str(pathlib.Path(__file__).parents[1] / "configs/vit_cifar10.py:cpu"), "Config.", lock_config=True
)
_STEPS = flags.DEFINE_integer("steps", 30, "Timed train steps (alone, and fed by the pipeline).")
_BATCHES = flags.DEFINE_integer("batches", 50, "Timed pipeline batches.")
WARMUP = 3


def images_per_second(run_one, count: int, batch_size: int, sync=lambda: None) -> float:
    """batch_size * count / seconds for count calls of run_one after WARMUP untimed ones."""
    for _ in range(WARMUP):
        run_one()
    sync()
    start = time.perf_counter()
    for _ in range(count):
        run_one()
    sync()
    return batch_size * count / (time.perf_counter() - start)


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    keep_freed_memory()
    import flax.linen as nn
    import jax

    from lm import sharding
    from lm.cli.resolve import build_experiment
    from lm.layers.moe import parameter_counts
    from lm.train.setup import build

    config = _CONFIG.value
    batch_size = config.train.batch_size
    setup = build(config, build_experiment, devices=None)
    mesh = setup.mesh

    # 1. The pipeline alone.
    pipeline = iter(setup.train_data(0))
    pipeline_rate = images_per_second(lambda: next(pipeline), _BATCHES.value, batch_size)

    # 2. The train step alone, as the trainer builds it.
    with jax.set_mesh(mesh), nn.logical_axis_rules(setup.rules):
        _, state_shardings = setup.abstract_state()
        state = setup.init_state(state_shardings)
        step_fn = setup.jit_train_step(state_shardings)
        fixed_batch = sharding.assemble_batch(next(pipeline), mesh, batch_size)
        holder = {"state": state, "metrics": None}

        def step(batch):
            holder["state"], holder["metrics"] = step_fn(holder["state"], (batch,))

        def sync():
            jax.block_until_ready(holder["state"])

        start = time.perf_counter()
        step(fixed_batch)
        sync()
        compile_seconds = time.perf_counter() - start
        step_rate = images_per_second(lambda: step(fixed_batch), _STEPS.value, batch_size, sync)

        # 3. Both: train steps on the pipeline's batches.
        together_rate = images_per_second(
            lambda: step(sharding.assemble_batch(next(pipeline), mesh, batch_size)), _STEPS.value, batch_size, sync
        )
    loss = float(np.asarray(holder["metrics"]["loss"])[-1])

    d = config.data
    print("\n=== benchmark: vit_cifar10 pipeline vs train step ===")
    print(f"device               {jax.devices()[0].device_kind} x {jax.device_count()}")
    print(f"parameters           {parameter_counts(holder['state'].params)[0]:,}")
    print(f"batch                {batch_size} images | augmentation: crop {d.crop_padding}, flip {d.flip}, "
          f"randaugment {d.randaugment_ops} ops @ {d.randaugment_magnitude}, mixup {d.mixup_alpha}, "
          f"cutmix {d.cutmix_alpha} | workers {d.num_workers}")
    print(f"compile time         {compile_seconds:.1f} s")
    print(f"pipeline alone       {pipeline_rate:,.0f} images/s")
    print(f"train step alone     {step_rate:,.0f} images/s")
    print(f"train fed by data    {together_rate:,.0f} images/s (loss {loss:.3f})")
    verdict = "the pipeline" if pipeline_rate < 1.5 * step_rate else "the train step"
    print(f"bottleneck           {verdict} (pipeline / step = {pipeline_rate / step_rate:.1f}x)")
    if hasattr(pipeline, "close"):
        pipeline.close()


if __name__ == "__main__":
    app.run(main)
