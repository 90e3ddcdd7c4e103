"""Benchmark: every experiment's train step alone against the whole trainer, on this machine's devices.

  python benchmarks/accelerator.py            # the accelerator rows (GPT-2 124M, small, translation, ViT full,
                                              # BERT-Base pretraining and SST-2 fine-tuning in bf16)
  python benchmarks/accelerator.py --quick    # the CPU-sized rows (baby, the test configs): any machine
  python benchmarks/accelerator.py --rows=small_bf16,small_fp32   # some rows
  python benchmarks/accelerator.py --quick --profile=traces     # also a trace of each row's step alone

Per row (a config and its overrides), one process, one after another:
  step alone   the train step as the trainer builds it (lm.train.loop: mesh, shardings, donated state,
               train.steps_per_dispatch) run over a few batches already on the devices, every batch
               shape compiled first, in parallel as the trainer does (timed: the cold compile, persistent
               cache empty); the median of --rounds rounds of the mean step time; units (tokens, images)
               per second, MFU (model FLOPs 6N + attention over the devices' dense bf16 peak; none on a
               CPU, whose peak is not known: lm.train.flops), the step's memory per device (XLA's
               analysis, the largest over the shapes).
  trainer      `lm train`'s train() (lm.train.loop) on a fresh workdir for the row's steps (data pipeline, prefetch,
               logging, one eval and one checkpoint at the end; no sampling or test decoding): its
               logged units/s (median over log intervals, the first left out), the compile seconds it
               logged (the cache now holds the step alone's programs: the warm compile) and its wall time.
  ratio        trainer units/s over step-alone units/s: what the loop loses (1.0: nothing).
  --profile    one more round of the step alone, untimed, traced by jax.profiler into DIR/<row> (TensorBoard,
               Perfetto: docs/performance.md); each row prints where.
Also the device, its peak memory so far in the process (GPU/TPU; a row after a larger one shows the
larger's), jax and flax versions. Rows run in --rows's order; each is printed and saved as it ends (a run cut
short keeps its rows); a row that fails prints its error, the others go on, and the run exits non-zero. The
figures go to benchmarks/results/accelerator-<quick|full>-<device>.json; the last line printed is
`summary: trainer_over_step=<min over rows> ...`.
"""

import datetime
import json
import pathlib
import platform
import shutil
import statistics
import tempfile
import time

from absl import app, flags, logging

from lm import runs
from lm.cpu import keep_freed_memory
from lm.errors import UserError, run_user_errors
from lm.xla_flags import set_default_flags

_QUICK = flags.DEFINE_bool("quick", False, "The CPU-sized rows (baby and the test configs) instead of the "
                           "accelerator rows.")
_ROWS = flags.DEFINE_list("rows", [], "Only these rows (names as printed), in this order; default: all of the set.")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Timed rounds of the step alone (after one untimed round).")
_PROFILE = flags.DEFINE_string("profile", "", "A folder: trace one more round of each row's step alone (untimed) "
                               "into <folder>/<row>; '' = no trace.")
_OUT = flags.DEFINE_string("out", str(pathlib.Path(__file__).parent / "results"), "Folder for the JSON.")

TRAINER_RUN = {"train.log_every": 10}  # the trainer's throughput is its logged units/s

# name: (config, overrides, step-alone steps per round, trainer steps (0: no trainer run))
FULL_ROWS = {
    "gpt2_124m_b16": ("configs/gpt2.py:124m", {"data.dataset": "synthetic", "train.batch_size": 16,
                                               "train.grad_accum_steps": 1}, 20, 200),
    "gpt2_124m_b16_scanned": ("configs/gpt2.py:124m", {"data.dataset": "synthetic", "train.batch_size": 16,
                                                       "train.grad_accum_steps": 1, "model.scan_layers": True},
                              20, 200),
    "gpt2_124m_b16_muon": ("configs/gpt2.py:124m", {"data.dataset": "synthetic", "train.batch_size": 16,
                                                    "train.grad_accum_steps": 1, "optimizer.name": "muon"}, 20, 0),
    "gpt2_124m_b32": ("configs/gpt2.py:124m", {"data.dataset": "synthetic", "train.batch_size": 32,
                                               "train.grad_accum_steps": 1}, 10, 0),
    "gpt2_124m_b64": ("configs/gpt2.py:124m", {"data.dataset": "synthetic", "train.batch_size": 64,
                                               "train.grad_accum_steps": 1}, 10, 0),
    "small_fp32": ("configs/gpt_shakespeare.py:small", {}, 50, 500),
    "small_bf16": ("configs/gpt_shakespeare.py:small", {"model.compute_dtype": "bfloat16"}, 50, 500),
    "translate_transformer": ("configs/translate_transformer.py:base", {}, 50, 500),
    "translate_rnn": ("configs/translate_rnn.py:attention", {}, 30, 300),
    "vit_full": ("configs/vit_cifar10.py:full", {}, 20, 300),
    "bert_base_bf16": ("configs/bert.py:base", {"model.compute_dtype": "bfloat16"}, 20, 200),
    "bert_base_sst2_bf16": ("configs/bert_finetune.py:sst2_base", {"model.compute_dtype": "bfloat16"}, 20, 200),
}
QUICK_ROWS = {
    "baby": ("configs/gpt_shakespeare.py:baby", {}, 20, 200),
    "gpt2_test": ("configs/gpt2.py:test", {}, 20, 100),
    "translate_transformer_test": ("configs/translate_transformer.py:test", {}, 20, 60),
    "translate_rnn_test": ("configs/translate_rnn.py:test", {}, 20, 60),
    "vit_test": ("configs/vit_cifar10.py:test", {}, 20, 60),
    "bert_tiny": ("configs/bert.py:tiny", {}, 20, 60),
    "bert_tiny_sst2": ("configs/bert_finetune.py:sst2_tiny", {}, 20, 60),
}


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)
    keep_freed_memory()
    set_default_flags()  # lm's XLA flags on a GPU, as the lm command sets them
    run_user_errors(benchmark)


def step_alone(config, steps: int, rounds: int, profile: pathlib.Path | None = None) -> dict:
    """The trainer's compiled step over the first batches of its pipeline, already placed: cold
    compile seconds (all shapes), median seconds per step, the step's memory per device. With a profile
    folder, one more round (untimed) is traced into it."""
    import flax.linen as nn
    import jax

    from lm import sharding
    from lm.cli.resolve import build_experiment
    from lm.layers.moe import parameter_counts
    from lm.train.compiled import CompiledPerShape, compile_in_parallel
    from lm.train.profile import trace_written
    from lm.train.setup import build

    setup = build(config, build_experiment, None)
    mesh, experiment = setup.mesh, setup.experiment
    per_call = config.train.steps_per_dispatch or 1  # (0, the trainer's own choice: one step a call here)
    with jax.set_mesh(mesh), nn.logical_axis_rules(setup.rules):
        _, shardings = setup.abstract_state()
        state = setup.init_state(shardings)
        pipeline = iter(setup.train_data(0))
        batches = [sharding.assemble_batch(next(pipeline), mesh, config.train.batch_size) for _ in range(steps)]
        groups = [tuple(batches[i : i + per_call]) for i in range(0, steps, per_call)]
        train_step = CompiledPerShape(setup.jit_train_step(shardings))
        compile_in_parallel([(train_step, state, group) for group in groups])  # every shape at once, as the trainer
        seconds = []
        for round_index in range(rounds + 1):  # round 0 compiles and warms up
            start = time.perf_counter()
            for group in groups:
                state, metrics = train_step(state, group)
            jax.block_until_ready((state, metrics))
            if round_index:
                seconds.append((time.perf_counter() - start) / steps)
        if profile:
            with jax.profiler.trace(profile, create_perfetto_trace=True):
                for first, group in zip(range(0, steps, per_call), groups, strict=True):
                    with jax.profiler.StepTraceAnnotation("train", step_num=first):
                        state, metrics = train_step(state, group)
                jax.block_until_ready((state, metrics))
            print(trace_written(profile, f"one round of the step alone ({steps} steps)"))
    memory = [c.memory_analysis() for c in train_step.compiled.values()]
    step_bytes = max(m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
                     for m in memory)
    active = experiment.active_params(state.params)
    return {
        "step_seconds": statistics.median(seconds),
        "step_seconds_min_max": [min(seconds), max(seconds)],
        "units_per_step": config.train.batch_size * experiment.units_per_example,
        "unit": experiment.unit,
        "flops_per_step": config.train.batch_size * experiment.flops_per_example(active),
        "num_params": parameter_counts(state.params)[0],
        "compile_seconds_cold": train_step.seconds,
        "batch_shapes": len(train_step.compiled),
        "step_memory_bytes": step_bytes,
    }


def trainer_run(config, steps: int, workdir: pathlib.Path) -> dict:
    """train() for `steps` steps: logged units/s (median over the log intervals after the first), its
    compile seconds and wall time."""
    from lm.cli.resolve import build_experiment
    from lm.train import loop

    config.train.update(num_steps=steps, checkpoint_every=steps)  # the learning-rate schedule follows num_steps
    config.eval.every = steps
    if "max_new_tokens" in config.get("sample", {}):
        config.sample.max_new_tokens = 0
    if "beam_sizes" in config.eval:
        config.eval.beam_sizes = ()  # no test-set decoding: not the loop's speed
    start = time.perf_counter()
    summary = loop.train(config, str(workdir), build_experiment)
    wall = time.perf_counter() - start
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    unit_key = next(k for r in records for k in r if k.endswith("_per_second") and k != "steps_per_second")
    rates = [r[unit_key] for r in records if unit_key in r][1:] or [r[unit_key] for r in records if unit_key in r]
    return {"trainer_units_per_second": statistics.median(rates), "trainer_compile_seconds": summary["compile_seconds"],
            "trainer_wall_seconds": wall, "eval_loss": summary.get("eval_loss")}


def benchmark() -> None:
    import flax
    import jax

    from lm.train.flops import peak_flops_per_device

    rows = QUICK_ROWS if _QUICK.value else FULL_ROWS
    unknown = sorted(set(_ROWS.value) - set(rows))
    if unknown:
        raise UserError(f"--rows: no row {', '.join(unknown)}; the rows are {', '.join(rows)}")
    chosen = {name: rows[name] for name in _ROWS.value or rows}
    device = jax.devices()[0]
    device_peak = peak_flops_per_device(device)  # None on a CPU: no MFU
    peak = device_peak * jax.device_count() if device_peak else None
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="lm-accelerator-"))
    cache = {"train.compilation_cache_dir": str(scratch / "cache")}  # empty: the first compiles are cold
    print(f"device {device.device_kind} x {jax.device_count()} | jax {jax.__version__} | flax {flax.__version__} | "
          f"peak {f'{peak / 1e12:,.2f} TFLOP/s' if peak else 'unknown (no MFU)'}")
    out = pathlib.Path(_OUT.value)
    out.mkdir(parents=True, exist_ok=True)
    kind = "".join(c if c.isalnum() else "_" for c in device.device_kind.lower())
    path = out / f"accelerator-{'quick' if _QUICK.value else 'full'}-{kind}.json"
    header = {"date": datetime.date.today().isoformat(), "device": device.device_kind,
              "device_count": jax.device_count(), "jax": jax.__version__, "flax": flax.__version__,
              "python": platform.python_version(), "peak_flops": peak}
    results = {}
    try:
        for name, (spec, overrides, steps, trainer_steps) in chosen.items():
            print(f"\n--- {name}: {spec} {' '.join(f'--config.{k}={v}' for k, v in overrides.items())}")
            row_start = time.perf_counter()
            try:
                results[name] = measure_row(spec, {**overrides, **cache}, steps, trainer_steps, peak, scratch / name)
            except Exception as e:  # one failing row (a kernel the device lacks, memory) does not lose the others
                results[name] = {"config": spec, "overrides": overrides, "error": f"{type(e).__name__}: {e}"}
            results[name]["row_wall_seconds"] = time.perf_counter() - row_start
            print(f"row {row_line(name, results[name])}  ({results[name]['row_wall_seconds']:.0f} s)", flush=True)
            runs.write_json(path, {**header, "rows": results})  # whole after each row: a run cut short keeps its rows
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print(f"\n=== accelerator benchmark ({'quick' if _QUICK.value else 'full'}): {device.device_kind} "
          f"x {jax.device_count()}, jax {jax.__version__}, flax {flax.__version__} ===")
    print(f"{'row':<28} {'ms/step':>9} {'units/s':>12} {'MFU':>6} {'trainer units/s':>18} {'ratio':>6} "
          f"{'compile cold s':>15} {'trainer compile s':>18} {'step memory':>12} {'device peak':>12}")
    for name, r in results.items():
        print(row_line(name, r))
    print(f"wrote {path}")
    ratios = {n: r["trainer_over_step"] for n, r in results.items() if "trainer_over_step" in r}
    worst = min(ratios, key=ratios.get) if ratios else None
    failed = [n for n, r in results.items() if "error" in r]
    print(f"summary: trainer_over_step={f'{ratios[worst]:.3f} (row {worst})' if worst else '-'} rows={len(results)} "
          f"failed={','.join(failed) or 0} device={kind} jax={jax.__version__} flax={flax.__version__}")
    if failed:
        raise UserError(f"rows failed: {', '.join(failed)} (their errors are printed above and in {path})")


def measure_row(spec: str, overrides: dict, steps: int, trainer_steps: int, peak: float | None,
                workdir: pathlib.Path) -> dict:
    """One row: the step alone, then (trainer_steps > 0) the trainer, and the device's peak memory."""
    import jax

    from lm.cli.overrides import resolve_config

    shown = {k: v for k, v in overrides.items() if k != "train.compilation_cache_dir"}
    profile = pathlib.Path(_PROFILE.value).absolute() / workdir.name if _PROFILE.value else None
    row = {"config": spec, "overrides": shown,
           **step_alone(resolve_config(spec, overrides), steps, _ROUNDS.value, profile)}
    row["units_per_second"] = row["units_per_step"] / row["step_seconds"]
    if peak:
        row["mfu"] = row["flops_per_step"] / row["step_seconds"] / peak
    if trainer_steps:
        row.update(trainer_run(resolve_config(spec, {**overrides, **TRAINER_RUN}), trainer_steps, workdir))
        row["trainer_over_step"] = row["trainer_units_per_second"] / row["units_per_second"]
    row["device_peak_bytes"] = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
    return row


def row_line(name: str, r: dict) -> str:
    """A row of the printed table (units/s in the row's own unit)."""
    from lm.train.metrics import format_bytes

    if "error" in r:
        return f"{name:<28} failed: {r['error'][:300]}"
    trainer = (f"{r['trainer_units_per_second']:>18,.0f} {r['trainer_over_step']:>6.2f}"
               if "trainer_over_step" in r else f"{'-':>18} {'-':>6}")
    trainer_compile = f"{r['trainer_compile_seconds']:>18.1f}" if "trainer_compile_seconds" in r else f"{'-':>18}"
    device_peak = format_bytes(r["device_peak_bytes"]) if r["device_peak_bytes"] else "-"
    mfu = f"{r['mfu']:>6.1%}" if "mfu" in r else f"{'-':>6}"
    return (f"{name:<28} {r['step_seconds'] * 1e3:>9.2f} {r['units_per_second']:>12,.0f} {mfu} {trainer} "
            f"{r['compile_seconds_cold']:>15.1f} {trainer_compile} {format_bytes(r['step_memory_bytes']):>12} "
            f"{device_peak:>12}")

if __name__ == "__main__":
    app.run(main)
