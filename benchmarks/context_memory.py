"""Benchmark: per-device memory of the train step with the sequence split over the mesh (context parallelism).

  python benchmarks/context_memory.py [--context=32768] [--shards=1,2,4,8] [--out=FILE.json]

Compiles, as `lm train --dry_run` does (lm.train.dry_run, on 8 host-platform devices), the train step of a small
GPT (configs/gpt2.py:test: 2 layers, width 64, 4 heads, float32, learned positions) at one row of --context tokens
for each `mesh.context` of --shards (data = 1) and each form of `model.context_parallel` (all_gather, ring,
ring_zigzag), and prints per device XLA's memory analysis of the step: temporaries (the activations), arguments, and
the temporaries' ratio to one device's. Then looks in the optimized HLO of the ring step on the most shards for
whether its collective-permutes are asynchronous (a start and a done with the block's computation scheduled between
them).
Writes the table to --out (default benchmarks/results/context_memory.json) as json.
"""

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import json  # noqa: E402
import pathlib  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402

from absl import app, flags, logging  # noqa: E402

_CONTEXT = flags.DEFINE_integer("context", 32768, "Tokens in the one row of the batch.")
_SHARDS = flags.DEFINE_list("shards", ["1", "2", "4", "8"], "The mesh.context sizes.")
_OUT = flags.DEFINE_string("out", "benchmarks/results/context_memory.json", "Where the json goes.")
FORMS = ("all_gather", "ring", "ring_zigzag")


def config_for(context: int, shards: int, form: str):
    """configs/gpt2.py:test at one row of `context` tokens, float32, split over `shards` devices by `form`."""
    from lm.cli.overrides import resolve_config

    return resolve_config("configs/gpt2.py:test", {
        "data.context_length": str(context), "train.batch_size": "1", "model.compute_dtype": "float32",
        "model.loss_chunk": "1024", "mesh.data": "1", "mesh.fsdp": "1", "mesh.context": str(shards),
        "model.context_parallel": form,
    })


def ring_hlo(config) -> str:
    """The optimized HLO text of config's compiled train step, lowered as lm.train.dry_run lowers it."""
    import flax.linen as nn
    import jax

    from lm import sharding
    from lm.cli.resolve import build_experiment
    from lm.train.setup import build

    setup = build(config, build_experiment, jax.devices()[:config.mesh.context])
    host_batch = next(iter(setup.train_data(0)))
    batch_sharding = sharding.batch_sharding(setup.mesh)
    batch_shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=batch_sharding), host_batch)
    with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
        state_shapes, state_shardings = setup.abstract_state()
        return setup.jit_train_step(state_shardings).lower(state_shapes, (batch_shapes,)).compile().as_text()


def permute_schedule(hlo: str) -> dict:
    """Counts of the collective-permutes in hlo: synchronous ones, async start/done pairs, and the pairs with a
    dot or fusion scheduled between start and done (in the entry and the computations it calls, line order)."""
    lines = hlo.splitlines()
    sync = sum(1 for line in lines if re.search(r"= \S+ collective-permute\(", line))
    starts = [i for i, line in enumerate(lines) if "collective-permute-start(" in line]
    overlapped = 0
    for i in starts:
        name = lines[i].split("=")[0].strip().lstrip("%").removeprefix("ROOT ").strip()
        done = next((j for j in range(i + 1, len(lines)) if "collective-permute-done(" in lines[j]
                     and re.search(rf"%?{re.escape(name)}\b", lines[j])), None)
        if done is not None and any(re.search(r" (dot|fusion|convolution)\(", lines[k]) for k in range(i + 1, done)):
            overlapped += 1
    return {"synchronous": sync, "async_pairs": len(starts), "async_pairs_with_compute_between": overlapped}


def cpu_model() -> str:
    """The host CPU's model name (/proc/cpuinfo), or the machine type where there is none."""
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    found = re.search(r"model name\s*:\s*(.+)", cpuinfo.read_text()) if cpuinfo.exists() else None
    return found.group(1).strip() if found else platform.machine()


def benchmark() -> None:
    import jax

    from lm.cli.resolve import build_experiment
    from lm.train.dry_run import dry_run

    context, shards = _CONTEXT.value, [int(s) for s in _SHARDS.value]
    start = time.perf_counter()
    rows = []
    for form in FORMS:
        for cp in shards:
            print(f"--- context {context}, mesh.context={cp}, {form}", flush=True)
            report = dry_run(config_for(context, cp, form), build_experiment, jax.devices()[:cp])
            rows.append({"form": form, "context_shards": cp, "temp_bytes": report["temp_bytes"],
                         "argument_bytes": report["argument_bytes"], "output_bytes": report["output_bytes"],
                         "compile_seconds": round(report["compile_seconds"], 1)})
    for row in rows:
        one = next((r for r in rows if r["form"] == row["form"] and r["context_shards"] == 1), None)
        row["temp_ratio_to_one"] = round(row["temp_bytes"] / one["temp_bytes"], 4) if one else None
    print(f"ring HLO at mesh.context={max(shards)}", flush=True)
    schedule = permute_schedule(ring_hlo(config_for(context, max(shards), "ring")))
    wall = time.perf_counter() - start

    mib = 2 ** 20
    print(f"\ncontext {context}, batch 1, configs/gpt2.py:test in float32 ({jax.devices()[0].platform})\n")
    print("| form | mesh.context | temporaries / device (MiB) | ratio to 1 device | 1 / CP | "
          "arguments / device (MiB) |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        ratio = row["temp_ratio_to_one"]
        print(f"| {row['form']} | {row['context_shards']} | {row['temp_bytes'] / mib:,.1f} | "
              f"{'-' if ratio is None else f'{ratio:.3f}'} | {1 / row['context_shards']:.3f} | "
              f"{row['argument_bytes'] / mib:,.2f} |")
    print(f"\nring's collective-permutes in the optimized HLO (mesh.context={max(shards)}): {schedule}")
    print(f"wall time {wall:.0f} s")
    result = {"context": context, "batch_size": 1, "config": "configs/gpt2.py:test, model.compute_dtype=float32",
              "platform": jax.devices()[0].platform, "cpu": cpu_model(), "cores": os.cpu_count(),
              "rows": rows, "ring_collective_permutes": schedule, "wall_seconds": round(wall)}
    out = pathlib.Path(_OUT.value)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    benchmark()


if __name__ == "__main__":
    app.run(main)
