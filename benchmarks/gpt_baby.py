"""Benchmark: the `baby` GPT on Tiny Shakespeare, 2000 steps, as a user would run it.

  python benchmarks/gpt_baby.py [--workdir=/tmp/bench_baby] [--config.train.num_steps=2000 ...]

Prints steady-state tokens/s, compile time, wall time (process start to finish: imports, data,
compile, training, evals, checkpoints; no sampling), the model's FLOP/s next to the rate of a 1024^3 fp32
matmul measured on this machine in this run (a reference, not a peak: a CPU has no data-sheet peak here,
so this is no MFU and the run logs none), and val loss at steps 0/500/1000/1500/2000 (on the fixed
eval windows of the config) plus the loss over the whole val split at the end.
"""

import time

PROCESS_START = time.perf_counter()

import json  # noqa: E402
import pathlib  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402

import numpy as np  # noqa: E402
from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from lm.cpu import keep_freed_memory  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config", str(pathlib.Path(__file__).parents[1] / "configs/gpt_shakespeare.py:baby"), "Config.",
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/lm_bench_baby", "Run folder (deleted first).")


def full_split_loss(experiment, params, tokens: np.ndarray, batch_size: int = 64) -> float:
    """Mean next-token loss over every non-overlapping window of the split (token weighted)."""
    import jax

    length = experiment.config.data.context_length
    count = (len(tokens) - 1) // length
    windows = np.stack([tokens[i * length : i * length + length + 1] for i in range(count)])
    loss = jax.jit(lambda p, b: experiment.loss(p, b, jax.random.key(0), False)[0])
    losses, sizes = [], []
    for start in range(0, count, batch_size):
        chunk = windows[start : start + batch_size]
        losses.append(float(loss(params, {"inputs": chunk[:, :-1], "targets": chunk[:, 1:]})))
        sizes.append(len(chunk))
    return float(np.average(losses, weights=sizes))


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    keep_freed_memory()
    import jax

    from lm.cli.resolve import build_experiment
    from lm.train.flops import measure_matmul_peak
    from lm.train.loop import train
    from lm.train.setup import restore_params

    config = _CONFIG.value
    config.sample.max_new_tokens = 0  # time the training run as nanoGPT's train.py does: no sampling
    workdir = pathlib.Path(_WORKDIR.value)
    shutil.rmtree(workdir, ignore_errors=True)
    matmul_rate = measure_matmul_peak()  # before training, with the machine otherwise idle
    train_start = time.perf_counter()
    summary = train(config, str(workdir), build_experiment)
    train_seconds = time.perf_counter() - train_start
    wall = time.perf_counter() - PROCESS_START

    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    throughput = [r["tokens_per_second"] for r in records if "tokens_per_second" in r][1:]  # skip warm-up
    eval_loss = {r["step"]: r["eval_loss"] for r in records if "eval_loss" in r}

    experiment = build_experiment(config)
    params = restore_params(config, experiment, workdir)
    val_loss = full_split_loss(experiment, params, experiment.val_tokens)
    tokens_per_second = statistics.median(throughput)
    flops_per_token = experiment.flops_per_example(summary["active_params"]) / config.data.context_length
    model_flops = tokens_per_second * flops_per_token

    print("\n=== benchmark: gpt_shakespeare:baby ===")
    print(f"device               {jax.devices()[0].device_kind} x {jax.device_count()}")
    print(f"parameters           {summary['num_params']:,}")
    print(f"matmul rate          {matmul_rate / 1e9:.1f} GFLOP/s (1024^3 fp32, measured; not a peak)")
    print(f"tokens/s (median)    {tokens_per_second:,.0f}")
    print(f"model FLOP/s         {model_flops / 1e9:.1f} GFLOP/s ({model_flops / matmul_rate:.1%} of the matmul rate; "
          "not an MFU)")
    print(f"compile time         {summary['compile_seconds']:.1f} s")
    steps = config.train.num_steps
    print(f"train() time         {train_seconds:.1f} s (data, compile, {steps} steps, evals, checkpoints)")
    print(f"wall time            {wall:.1f} s (process start to trained model)")
    for step in range(0, config.train.num_steps + 1, 500):
        if step in eval_loss:
            print(f"val loss @ {step:>5}     {eval_loss[step]:.4f}")
    print(f"full val split loss  {val_loss:.4f} ({len(experiment.val_tokens):,} tokens)")


if __name__ == "__main__":
    app.run(main)
