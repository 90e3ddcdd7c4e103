"""Train and eval steps compiled ahead of time, once per batch shape, several at once in parallel."""

import concurrent.futures
import time
from typing import Any

import jax


class CompiledPerShape:
    """A jitted step(state_or_params, batch), compiled ahead of time once per batch shape (length-
    bucketed batches bring a few), with the compile seconds kept for the logs; `name` for them."""

    def __init__(self, jitted_step, name: str = "train step"):
        self.jitted_step = jitted_step
        self.name = name
        self.compiled: dict[tuple, jax.stages.Compiled] = {}
        self.seconds = 0.0

    @staticmethod
    def key(batch) -> tuple:
        return tuple(x.shape for x in jax.tree.leaves(batch))

    def __call__(self, state, batch):
        key = self.key(batch)  # (once per call: this is the loop's hot path)
        if key not in self.compiled:
            compile_in_parallel([(self, state, batch)])
        return self.compiled[key](state, batch)


def compile_in_parallel(jobs: list[tuple[CompiledPerShape, Any, Any]]) -> None:
    """Compiles each (step, state, batch) job whose shapes its step has not compiled yet: traced and
    lowered one after another, then compiled all at once in threads (XLA compiles them in parallel,
    on as many cores as there are jobs). batch may hold jax.ShapeDtypeStructs. The wall time is
    added to the first job's step."""
    todo: dict[tuple, tuple[CompiledPerShape, Any, Any]] = {}  # (step id, shapes) -> (step, lowered, batch)
    for step, state, batch in jobs:
        if step.key(batch) not in step.compiled and (id(step), step.key(batch)) not in todo:
            todo[(id(step), step.key(batch))] = (step, step.jitted_step.lower(state, batch), batch)
    if not todo:
        return
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(todo)) as pool:
        compiled = list(pool.map(lambda job: job[1].compile(), todo.values()))
    seconds = time.perf_counter() - start
    jobs[0][0].seconds += seconds
    for (step, _, batch), executable in zip(todo.values(), compiled, strict=True):
        step.compiled[step.key(batch)] = executable
        shapes = sorted({x.shape for x in jax.tree.leaves(batch)})
        steps = f", {len(batch)} steps per call" if isinstance(batch, tuple) else ""
        print(f"compiled the {step.name} for batch shapes {shapes}{steps}" + (
            f" in {seconds:.1f}s" if len(todo) == 1 else ""))
    if len(todo) > 1:
        print(f"compiled {len(todo)} programs in parallel in {seconds:.1f}s")
