"""The dry run: compile the train step for a config's mesh and print what a step costs, training nothing.

  lm train --config=configs/gpt2.py:124m --dry_run [--config.mesh.fsdp=8 ...]
"""

import math
import time

import flax.linen as nn
import jax
import ml_collections

from lm import sharding
from lm.layers.moe import parameter_counts
from lm.train.init_from import model_from_source
from lm.train.metrics import format_bytes
from lm.train.optim import trainable, trainable_line
from lm.train.setup import MakeExperiment, build


def dry_run(config: ml_collections.ConfigDict, make_experiment: MakeExperiment,
            devices: list[jax.Device] | None = None) -> dict[str, float]:
    """Compiles the train step of make_experiment(config, None) for config's mesh and one global batch, prints
    what a step costs and returns it, training and writing nothing: parameters (total, active), per-device memory of the
    compiled step (XLA's memory analysis: arguments, outputs, temporaries, generated code; and of the train state:
    parameters, the gradients of the trainable ones, optimizer state), FLOPs
    per step (XLA's count for one device's program; the model estimate for the whole batch) and the
    compile time. A mesh the devices or the batch do not fit, or a shape that does not shard, fails
    here, before any accelerator time is spent."""
    config = model_from_source(config)
    tcfg = config.train
    setup = build(config, make_experiment, devices)
    mesh, experiment = setup.mesh, setup.experiment
    host_batch = next(iter(setup.train_data(0)))
    batch_sharding = sharding.batch_sharding(mesh)
    batch_shapes = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct((tcfg.batch_size, *x.shape[1:]), x.dtype, sharding=batch_sharding), host_batch
    )
    with jax.set_mesh(mesh), nn.logical_axis_rules(setup.rules):
        state_shapes, state_shardings = setup.abstract_state()
        start = time.perf_counter()
        step = setup.jit_train_step(state_shardings)
        compiled = step.lower(state_shapes, (batch_shapes,)).compile()
        compile_seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    active_params = experiment.active_params(state_shapes.params)
    trained = jax.tree.map(lambda p, train: p if train else None, state_shapes.params, trainable(state_shapes.params))
    report = {
        "num_params": parameter_counts(state_shapes.params)[0],
        "active_params": active_params,
        "param_bytes": per_device_bytes(state_shapes.params),
        "gradient_bytes": per_device_bytes(trained),  # the step computes the gradients of the trainable ones alone
        "optimizer_state_bytes": per_device_bytes(state_shapes.opt_state),
        "argument_bytes": memory.argument_size_in_bytes,
        "output_bytes": memory.output_size_in_bytes,
        "alias_bytes": memory.alias_size_in_bytes,
        "temp_bytes": memory.temp_size_in_bytes,
        "code_bytes": memory.generated_code_size_in_bytes,
        "xla_flops_per_device": float(cost.get("flops", float("nan"))),
        "model_flops_per_step": tcfg.batch_size * experiment.flops_per_example(active_params),
        "compile_seconds": compile_seconds,
    }
    peak = report["argument_bytes"] + report["output_bytes"] - report["alias_bytes"] + report["temp_bytes"]
    print(f"dry run: mesh {dict(mesh.shape)} of {mesh.size} x {mesh.devices.flat[0].device_kind} | "
          f"global batch {tcfg.batch_size} (x {tcfg.grad_accum_steps} accumulation steps)")
    print(f"parameters        {report['num_params']:,} ({active_params:,} active)")
    if lora := trainable_line(state_shapes.params):
        print(f"LoRA              {lora}")
    print(f"memory per device arguments {format_bytes(report['argument_bytes'])} | outputs "
          f"{format_bytes(report['output_bytes'])} ({format_bytes(report['alias_bytes'])} of them donated inputs) | "
          f"temporaries {format_bytes(report['temp_bytes'])} | code {format_bytes(report['code_bytes'])} | "
          f"total {format_bytes(peak)}")
    state = report["param_bytes"] + report["gradient_bytes"] + report["optimizer_state_bytes"]
    print(f"state per device  parameters {format_bytes(report['param_bytes'])} | gradients "
          f"{format_bytes(report['gradient_bytes'])} (of the trainable ones) | optimizer state "
          f"{format_bytes(report['optimizer_state_bytes'])} | together {format_bytes(state)}")
    print(f"FLOPs per step    {report['xla_flops_per_device'] / 1e9:,.3f} GFLOP per device (XLA; it counts a loop "
          f"body once: scanned layers and accumulation steps are undercounted) | "
          f"{report['model_flops_per_step'] / 1e9:,.3f} GFLOP for the batch (model: 6N + attention)")
    print(f"compile           {compile_seconds:.1f} s")
    return report


def per_device_bytes(tree) -> int:
    """The bytes one device holds of a tree of arrays with shardings (jax.ShapeDtypeStruct)."""
    return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))
