"""Benchmark: the train-step time of config variants, side by side and interleaved.

  python benchmarks/step_time.py --config=configs/gpt_shakespeare.py:baby --arms=model.norm=layer,rms \
      [--rounds=15] [--steps=20] [--config.key=value ...]

Builds each arm's experiment, sharded state and jitted train step as the trainer does (one process,
the same devices), then times --steps steps of each arm in turn, round-robin, --rounds times (after
one untimed round), each arm on a fixed batch from its own pipeline. Prints per arm the median over
rounds of the mean step time, the spread (min-max over rounds), the arm's speed relative to the
first arm, and the parameters.
Interleaving spreads the slow stretches of a shared machine over every arm alike; runs one after
another, as in a sweep, can differ by more than the effect measured. Compile time is excluded.
"""

import statistics
import time

import numpy as np
from absl import app, flags, logging

from lm.cli import run_user_errors
from lm.cpu import keep_freed_memory
from lm.overrides import parse_axis, resolve_config, split_config_overrides

_CONFIG = flags.DEFINE_string("config", "configs/gpt_shakespeare.py:baby", "Config file and variant.")
_ARMS = flags.DEFINE_string("arms", "model.norm=layer,rms", "The variants: key=value1,value2,...")
_ROUNDS = flags.DEFINE_integer("rounds", 15, "Rounds of the round-robin.")
_STEPS = flags.DEFINE_integer("steps", 20, "Timed steps per arm per round.")
_OVERRIDES: dict[str, str] = {}


def parse_benchmark_flags(argv: list[str]) -> list[str]:
    rest, overrides = split_config_overrides(argv)
    _OVERRIDES.update(overrides)
    return flags.FLAGS(rest)


class Arm:
    """One variant's train step on a fixed batch, ready to time (state donated step to step)."""

    def __init__(self, config):
        import flax.linen as nn
        import jax

        from lm import sharding
        from lm.train.loop import abstract_state, build, count_params, init_state, jit_train_step

        self.mesh, self.rules, experiment, optimizer, init_boxed = build(config, devices=None)
        rng = jax.random.key(config.seed)
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            _, shardings = abstract_state(init_boxed, rng, self.mesh, self.rules)
            self.state = init_state(init_boxed, rng, shardings)
            self.step_fn = jit_train_step(config, experiment, optimizer, shardings, self.mesh)
            data = iter(experiment.train_data(config.train.batch_size, config.seed, (0, 1), 0))
            self.batch = sharding.assemble_batch(next(data), self.mesh, config.train.batch_size)
            self.num_params = count_params(self.state.params)
            self.run(1)  # compile and warm up

    def run(self, steps: int) -> float:
        """Mean seconds per step over `steps` steps."""
        import flax.linen as nn
        import jax

        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            start = time.perf_counter()
            for _ in range(steps):
                self.state, metrics = self.step_fn(self.state, self.batch)
            jax.block_until_ready(self.state)
        return (time.perf_counter() - start) / steps


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    keep_freed_memory()
    run_user_errors(benchmark)  # bad --arms or overrides: one line, exit code 2


def benchmark() -> None:
    import jax

    key, values = parse_axis(_ARMS.value, flag="--arms")
    arms = {value: Arm(resolve_config(_CONFIG.value, {**_OVERRIDES, key: value})) for value in values}
    times = {value: [] for value in arms}
    for round_index in range(1 + _ROUNDS.value):  # round 0 warms every arm up and is not counted
        for value, arm in arms.items():
            seconds = arm.run(_STEPS.value)
            if round_index:
                times[value].append(seconds)

    print(f"\n=== benchmark: step time of {key} = {', '.join(values)} ({_CONFIG.value}) ===")
    print(f"device {jax.devices()[0].device_kind} x {arms[values[0]].mesh.size} | {_ROUNDS.value} rounds x "
          f"{_STEPS.value} steps per arm, interleaved")
    reference = statistics.median(times[values[0]])
    print(f"{'arm':<20} {'median ms/step':>15} {'min-max ms':>15} {'speed vs first':>15} {'parameters':>12}")
    for value, arm in arms.items():
        ms = np.array(times[value]) * 1e3
        print(f"{key.split('.')[-1] + '=' + value:<20} {np.median(ms):>15.2f} "
              f"{f'{ms.min():.2f}-{ms.max():.2f}':>15} {reference * 1e3 / np.median(ms):>14.3f}x "
              f"{arm.num_params:>12,}")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_benchmark_flags)
