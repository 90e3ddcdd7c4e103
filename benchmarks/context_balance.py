"""Benchmark: each device's causal attention work in the ring over mesh.context, contiguous vs zig-zag layout.

  python benchmarks/context_balance.py [--shards=2,4,8] [--out=benchmarks/results/context_balance.json]

Cuts a row into 2n chunks of equal length (n = mesh.context) and counts, for each device of the ring and each
layout of model.context_parallel (ring: contiguous, device i holding chunks 2i and 2i+1; ring_zigzag: chunks i and
2n-1-i), the (query chunk, key chunk) blocks over its ring steps that the causal mask does not cover entirely (the
work causal attention has to do) and the blocks the ring computes (lm.layers.attention.ring_attention: in the
zig-zag layout, of another device's block the quarters ZIGZAG_QUARTERS names, else every block whole). The ring's
steps run in lockstep (each hop waits for every device), so its time goes as the sum over the steps of the most
blocks a device computes in the step: the last column. Exact counts from the masks, not timings.
"""

import json
import pathlib

from absl import app, flags

from lm.layers.attention import RING_LAYOUTS, ZIGZAG_QUARTERS, layout_order

WHOLE = {(q, k) for q in (0, 1) for k in (0, 1)}  # the (query half, key half) quarters of a block


def ring_work(shards: int, layout: str) -> dict:
    """Per device, over its ring steps: `needed`, the (query chunk, key chunk) pairs of the 2n chunks with a key
    at or before a query; `computed`, the pairs the ring computes; `missed`, needed pairs it does not compute
    (0, or the ring would be wrong); and `lockstep`, the sum over steps of the most pairs a device computes."""
    held = layout_order(2 * shards, shards, layout).reshape(shards, 2)  # with one token a chunk: the chunks
    earlier, later = ZIGZAG_QUARTERS if layout == "zigzag" else (WHOLE, WHOLE)
    needed, computed, missed = [0] * shards, [0] * shards, [0] * shards
    lockstep = 0
    for step in range(shards):
        step_most = 0
        for here in range(shards):
            source = (here - step) % shards
            done = WHOLE if step == 0 else earlier if source < here else later
            pairs = {(q, k) for q, k in WHOLE if held[source][k] <= held[here][q]}
            needed[here] += len(pairs)
            computed[here] += len(done)
            missed[here] += len(pairs - done)
            step_most = max(step_most, len(done))
        lockstep += step_most
    return {"needed": needed, "computed": computed, "missed": missed, "lockstep": lockstep}


def benchmark() -> None:
    rows = []
    for shards in map(int, flags.FLAGS.shards):
        for form, layout in RING_LAYOUTS.items():
            rows.append({"context_shards": shards, "form": form, **ring_work(shards, layout)})
    print("(query chunk, key chunk) blocks of the 2n chunks of a row; n = mesh.context\n")
    print("| mesh.context | `model.context_parallel` | needed per device | computed per device | slowest device | "
          "ring's lockstep cost |")
    print("|---:|---|---|---|---:|---:|")
    for row in rows:
        print(f"| {row['context_shards']} | `{row['form']}` | {', '.join(map(str, row['needed']))} | "
              f"{', '.join(map(str, row['computed']))} | {max(row['computed'])} | {row['lockstep']} |")
    out = pathlib.Path(flags.FLAGS.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


def define_flags() -> None:
    """The script's flags, defined when it runs (not on import: tests/test_context_parallel.py imports ring_work
    beside lm's commands, whose --out it would clash with)."""
    flags.DEFINE_list("shards", ["2", "4", "8"], "The mesh.context sizes.")
    flags.DEFINE_string("out", "benchmarks/results/context_balance.json", "Where the json goes.")


def main(argv):
    del argv
    benchmark()


if __name__ == "__main__":
    define_flags()
    app.run(main)
