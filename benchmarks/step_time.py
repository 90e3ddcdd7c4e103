"""Benchmark: throughput, compile time, memory and MFU of config variants, side by side and interleaved.

  python benchmarks/step_time.py --config=configs/gpt_shakespeare.py:baby --arms=model.norm=layer,rms \
      [--rounds=15] [--steps=20] [--config.key=value ...]
  python benchmarks/step_time.py --config=configs/gpt2.py:124m --config.data.dataset=synthetic \
      --arms=model.remat=none,dots,dots_no_batch,full      # the remat table
  python benchmarks/step_time.py --config=configs/gpt2.py:124m --config.data.dataset=synthetic \
      --arms=model.scan_layers=false,true --rounds=0 --compiles=5   # compile time only

Builds each arm's experiment, sharded state and train step as the trainer does (one process, the
same devices) and compiles it ahead of time (timed: the fastest of --compiles, interleaved, with the persistent
compilation cache off), then
times --steps steps of each arm in turn, round-robin, --rounds times (after one untimed round), each
arm on a fixed batch from its own pipeline. Prints per arm: the median over rounds of the mean step
time, its spread (min-max over rounds), speed relative to the first arm, units (tokens, images,
...) per second, MFU (model FLOPs per step, 6N + attention, over the step time and the devices' dense
bf16 peak, as the trainer logs it; "-" on a CPU, whose peak is not known), compile seconds, the step's
memory per device (XLA's analysis of the compiled step: arguments + outputs - donated + temporaries,
what the allocator needs) and the parameters. Where the device reports it (GPU, TPU), the device's
peak memory over the whole run is printed too.
Interleaving spreads the slow stretches of a shared machine over every arm alike; runs one after
another, as in a sweep, can differ by more than the effect measured.
"""

import statistics
import time

import numpy as np
from absl import app, flags, logging

from lm.cli.overrides import parse_axis, resolve_config, split_config_overrides
from lm.cpu import keep_freed_memory
from lm.errors import run_user_errors
from lm.xla_flags import set_default_flags

_CONFIG = flags.DEFINE_string("config", "configs/gpt_shakespeare.py:baby", "Config file and variant.")
_ARMS = flags.DEFINE_string("arms", "model.norm=layer,rms", "The variants: key=value1,value2,...")
_ROUNDS = flags.DEFINE_integer("rounds", 15, "Rounds of the round-robin (0: compile and report memory only).")
_STEPS = flags.DEFINE_integer("steps", 20, "Timed steps per arm per round.")
_COMPILES = flags.DEFINE_integer("compiles", 1, "Compiles per arm, interleaved; the fastest is reported.")
_OVERRIDES: dict[str, str] = {}


def parse_benchmark_flags(argv: list[str]) -> list[str]:
    rest, overrides = split_config_overrides(argv)
    _OVERRIDES.update(overrides)
    return flags.FLAGS(rest)


class Arm:
    """One variant's compiled train step on a fixed batch, ready to time (state donated step to step)."""

    def __init__(self, config):
        import flax.linen as nn
        import jax

        from lm import sharding
        from lm.cli.resolve import build_experiment
        from lm.layers.moe import parameter_counts
        from lm.train.setup import build

        setup = build(config, build_experiment, devices=None)
        self.mesh, self.rules, experiment = setup.mesh, setup.rules, setup.experiment
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            _, shardings = setup.abstract_state()
            self.state = setup.init_state(shardings)
            data = iter(experiment.train_data(config.train.batch_size, config.seed, (0, 1), 0))
            self.batch = sharding.assemble_batch(next(data), self.mesh, config.train.batch_size)
        self.jit_step = lambda: setup.jit_train_step(shardings)
        self.compile_seconds = float("inf")
        self.compile()
        memory = self.step_fn.memory_analysis()
        self.step_bytes = (memory.argument_size_in_bytes + memory.output_size_in_bytes
                           - memory.alias_size_in_bytes + memory.temp_size_in_bytes)
        self.num_params, _ = parameter_counts(self.state.params)
        self.units_per_step = config.train.batch_size * experiment.units_per_example
        self.unit = experiment.unit
        self.flops_per_step = config.train.batch_size * experiment.flops_per_example(
            experiment.active_params(self.state.params))

    def compile(self) -> None:
        """Traces, lowers and compiles the step afresh (a new jit: no in-memory cache); compile_seconds
        keeps the fastest of the compiles so far."""
        import flax.linen as nn
        import jax

        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            start = time.perf_counter()
            self.step_fn = self.jit_step().lower(self.state, (self.batch,)).compile()
            self.compile_seconds = min(self.compile_seconds, time.perf_counter() - start)

    def run(self, steps: int) -> float:
        """Mean seconds per step over `steps` steps."""
        import flax.linen as nn
        import jax

        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            start = time.perf_counter()
            for _ in range(steps):
                self.state, metrics = self.step_fn(self.state, (self.batch,))
            jax.block_until_ready(self.state)
        return (time.perf_counter() - start) / steps


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    keep_freed_memory()
    set_default_flags()  # lm's XLA flags on a GPU, as the lm command sets them
    run_user_errors(benchmark)  # bad --arms or overrides: one line, exit code 2


def benchmark() -> None:

    from lm.train.flops import peak_flops_per_device
    from lm.train.metrics import format_bytes

    key, values = parse_axis(_ARMS.value, flag="--arms")
    no_cache = {"train.compilation_cache_dir": "none"}  # compile times from scratch
    arms = {value: Arm(resolve_config(_CONFIG.value, {**_OVERRIDES, **no_cache, key: value})) for value in values}
    for _ in range(_COMPILES.value - 1):
        for arm in arms.values():
            arm.compile()
    times = {value: [] for value in arms}
    for round_index in range(1 + _ROUNDS.value if _ROUNDS.value else 0):  # round 0 warms up, not counted
        for value, arm in arms.items():
            seconds = arm.run(_STEPS.value)
            if round_index:
                times[value].append(seconds)

    first = arms[values[0]]
    device = first.mesh.devices.flat[0]
    device_peak = peak_flops_per_device(device)  # None on a CPU: no MFU
    peak_flops = device_peak * first.mesh.size if device_peak else None
    shown_peak = f"{peak_flops / 1e12:,.2f} TFLOP/s in all" if peak_flops else "unknown: no MFU"
    print(f"\n=== benchmark: {key} = {', '.join(values)} ({_CONFIG.value}) ===")
    print(f"device {device.device_kind} x {first.mesh.size} (dense peak {shown_peak}) | "
          f"{_ROUNDS.value} rounds x {_STEPS.value} steps per arm, interleaved")
    unit_rate = f"{first.unit}/s"
    print(f"{'arm':<24} {'median ms/step':>15} {'min-max ms':>17} {'vs first':>9} {unit_rate:>12} {'MFU':>7} "
          f"{'compile s':>10} {'step memory':>12} {'parameters':>13}")
    reference = statistics.median(times[values[0]]) if _ROUNDS.value else None
    for value, arm in arms.items():
        timed = "-".rjust(15) + "-".rjust(18) + "-".rjust(10) + "-".rjust(13) + "-".rjust(8)  # --rounds=0
        if reference:
            ms = np.array(times[value]) * 1e3
            seconds = np.median(ms) / 1e3
            timed = (f"{np.median(ms):>15.1f} {f'{ms.min():.1f}-{ms.max():.1f}':>17} {reference / seconds:>8.3f}x "
                     f"{arm.units_per_step / seconds:>12,.0f} "
                     + (f"{arm.flops_per_step / seconds / peak_flops:>7.1%}" if peak_flops else f"{'-':>7}"))
        print(f"{key.split('.')[-1] + '=' + value:<24} {timed} {arm.compile_seconds:>10.1f} "
              f"{format_bytes(arm.step_bytes):>12} {arm.num_params:>13,}")
    stats = device.memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        print(f"device peak memory over the run (all arms): {format_bytes(stats['peak_bytes_in_use'])}")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_benchmark_flags)
