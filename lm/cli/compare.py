"""Compare training runs side by side: a table over seeds, a Markdown report and loss-curve plots.

  lm compare runs/norm [more directories] [--group_by=model.norm_position] [--out=runs/norm]
      [--spike=1.0] [--plot=eval_mlm_accuracy,eval_nsp_accuracy] [--against=data.max_train_examples]

Reads every run folder under the directories (any folder with config.json and metrics.jsonl written by
lm train: sweep arms, or runs copied in from elsewhere). A key missing from a run's config (a run made
before the key existed) reads as None. Runs whose configs differ only by `seed` form a
group (or, with --group_by=a,b, runs with the same values of those keys). Per group it prints n (seeds),
final and best val loss (last and lowest eval_loss) as mean ± sample std over seeds, the same for every
score in the runs' results.json (e.g. test BLEU, or val loss at a longer context; '-' where none has
it), steps/s (mean of the logged steps_per_second, leaving out each run's first logged interval),
train time (summary.json's train_seconds: the last segment's wall time in the training loop, compiles,
evals and checkpoints included),
parameters (summary.json) and how many runs diverged. It writes report.md, train_loss.png and
val_loss.png (mean curve over seeds with a min-max band) into --out (default: the directory), and
<metric>.png for each other logged metric named by --plot (e.g. BERT's eval_mlm_accuracy); its last line says
where they went.

--against=KEY (a numeric config key, e.g. data.max_train_examples for a learning curve) splits the groups by
KEY as well and draws, for each --plot metric, <metric>_by_<KEY>.png: the metric's final value (its
results.json score, else its last logged value) against KEY, on a log axis, one line per group of the other
keys: the mean over seeds with a min-max band.

Divergence: a run diverged if a logged train loss or eval loss is NaN or infinite, or if a logged train
loss (a mean over train.log_every steps) is more than --spike nats above the lowest train loss logged
before it.
"""

import dataclasses
import json
import math
import os
import pathlib
import sys

import numpy as np
from absl import app, flags

from lm.cli import define_string_once, parse_flags
from lm.errors import UserError, fail, run_user_errors
from lm.progress import shown_path
from lm.runs import (
    CONFIG_FILE,
    CONFIG_REMEDY,
    METRICS_FILE,
    RESULTS_FILE,
    RESULTS_REMEDY,
    SUMMARY_FILE,
    SUMMARY_REMEDY,
    flattened,
    read_json,
    read_records,
)

SPIKE_NATS = 1.0  # the default --spike
REPORT_FILE = "report.md"

_OUT = define_string_once("out", "Where report.md and the plots go (default: the runs directory).")
_GROUP_BY = flags.DEFINE_list("group_by", None, "Config keys that name a group (default: every key that "
                              "differs across the runs except seed).")
_SPIKE = flags.DEFINE_float("spike", SPIKE_NATS, "A train loss this many nats above the running minimum "
                            "counts as divergence.")
_PLOT = flags.DEFINE_list("plot", [], "More logged metrics (metrics.jsonl keys) to plot, one <metric>.png each.")
_AGAINST = flags.DEFINE_string("against", None, "A numeric config key: plot each --plot metric's final value "
                               "against it as well (<metric>_by_<key>.png), e.g. data.max_train_examples.")


@dataclasses.dataclass
class Run:
    path: pathlib.Path
    config: dict  # flattened: {'model.norm': 'layer', 'seed': 0, ...}
    records: list[dict]  # every metrics.jsonl record, in step order
    train: list[dict]  # metrics.jsonl records with a train 'loss', in step order
    eval: list[dict]  # records with 'eval_loss'
    summary: dict
    results: dict  # results.json without 'step' (scores after training, e.g. test BLEU); {} if absent


def flatten(tree: dict) -> dict:
    """{'model': {'norm': 'rms'}} -> {'model.norm': 'rms'} (lm.runs.flattened); lists become JSON strings
    (hashable)."""
    return {key: json.dumps(value) if isinstance(value, list) else value for key, value in flattened(tree).items()}


def read_run(path: pathlib.Path) -> Run:
    """The run in folder path; its damaged metrics lines are skipped, with a warning that counts them, and a
    damaged config.json, summary.json or results.json is a UserError naming it."""
    records, damaged = read_records(path / METRICS_FILE)
    if damaged:
        print(f"warning: {path / METRICS_FILE}: skipped {damaged} damaged line{'s' * (damaged > 1)}", file=sys.stderr)
    records.sort(key=lambda r: r["step"])
    summary_path, results_path = path / SUMMARY_FILE, path / RESULTS_FILE
    results = read_json(results_path, RESULTS_REMEDY) if results_path.is_file() else {}
    return Run(
        path=path,
        config=flatten(read_json(path / CONFIG_FILE, CONFIG_REMEDY)),
        records=records,
        train=[r for r in records if "loss" in r],
        eval=[r for r in records if "eval_loss" in r],
        summary=read_json(summary_path, SUMMARY_REMEDY) if summary_path.is_file() else {},
        results={k: v for k, v in results.items() if k != "step"},
    )


def find_runs(root: pathlib.Path) -> list[Run]:
    """Every folder at or under root with config.json and metrics.jsonl, in path order."""
    if not root.is_dir():
        raise UserError(f"{root} is not a directory")
    folders = sorted(p.parent for p in root.rglob(CONFIG_FILE) if (p.parent / METRICS_FILE).is_file())
    if not folders:
        raise UserError(f"no runs under {root}: a run folder holds config.json and metrics.jsonl (from lm train)")
    return [read_run(folder) for folder in folders]


def group_keys(runs: list[Run]) -> list[str]:
    """The config keys whose values differ across the runs, seed left out."""
    keys = sorted({k for run in runs for k in run.config})
    return [k for k in keys if k != "seed" and len({repr(run.config.get(k)) for run in runs}) > 1]


def group_runs(runs: list[Run], keys: list[str] | None = None) -> dict[str, list[Run]]:
    """{label: runs}: runs with equal values of keys (default group_keys(runs)), sorted by label, which
    is 'key=value,...' ('all runs' when no key differs)."""
    keys = group_keys(runs) if keys is None else keys
    known = {k for run in runs for k in run.config}
    unknown = [k for k in keys if k not in known]
    if unknown:
        raise UserError(f"--group_by: no run's config has {', '.join(unknown)}")
    groups: dict[str, list[Run]] = {}
    for run in runs:
        label = ",".join(f"{k}={run.config.get(k)}" for k in keys) or "all runs"
        groups.setdefault(label, []).append(run)
    return dict(sorted(groups.items()))


def divergence(run: Run, spike: float = SPIKE_NATS) -> str:
    """'' if the run trained stably, else why not: the first non-finite loss, or the first logged train
    loss more than `spike` above the lowest one logged before it."""
    for record in sorted(run.train + run.eval, key=lambda r: r["step"]):
        for key in ("loss", "eval_loss"):
            if key in record and not math.isfinite(record[key]):
                return f"{key} {record[key]} at step {record['step']}"
    lowest = math.inf
    for record in run.train:
        if record["loss"] > lowest + spike:
            return f"loss spike to {record['loss']:.3g} (min {lowest:.3g}) at step {record['step']}"
        lowest = min(lowest, record["loss"])
    return ""


def steps_per_second(run: Run) -> float | None:
    """Mean logged steps/s after the first logged interval (which pays for warm-up); None if none."""
    values = [r["steps_per_second"] for r in run.train[1:] if "steps_per_second" in r]
    return float(np.mean(values)) if values else None


def mean_std(values: list[float | None]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (ddof=1; None for one value) of the values that are not None
    (a NaN value makes both NaN: a diverged seed is not averaged away); (None, None) if there are none."""
    present = [v for v in values if v is not None]
    if not present:
        return None, None
    return float(np.mean(present)), float(np.std(present, ddof=1)) if len(present) > 1 else None


def group_stats(runs: list[Run], spike: float = SPIKE_NATS) -> dict:
    final = [r.eval[-1]["eval_loss"] if r.eval else None for r in runs]
    best = [float(np.min([e["eval_loss"] for e in r.eval])) if r.eval else None for r in runs]  # NaN-propagating
    reasons = {r.path.name: divergence(r, spike) for r in runs}
    return {
        "n": len(runs),
        "final_val_loss": mean_std(final),
        "best_val_loss": mean_std(best),
        "steps_per_second": mean_std([steps_per_second(r) for r in runs])[0],
        "train_seconds": mean_std([r.summary.get("train_seconds") for r in runs]),
        "num_params": runs[0].summary.get("num_params"),
        "active_params": runs[0].summary.get("active_params"),
        "diverged": {name: why for name, why in reasons.items() if why},
        "results": {key: mean_std([r.results.get(key) for r in runs])
                    for key in sorted({k for r in runs for k in r.results})},
    }


def format_mean_std(mean_and_std: tuple[float, float], digits: int = 4) -> str:
    mean, std = mean_and_std
    if mean is None:
        return "-"
    return f"{mean:.{digits}f}" + ("" if std is None else f" ± {std:.{digits}f}")


def format_params(count) -> str:
    return "-" if count is None else f"{count / 1e6:.3f}M" if count >= 1e5 else f"{count:,}"


def table(stats: dict[str, dict]) -> str:
    """A Markdown table, a row per group; a column for each results.json score any run has."""
    result_keys = sorted({k for s in stats.values() for k in s["results"]})
    rows = ["| group | n | final val loss | best val loss | " + "".join(f"{k} | " for k in result_keys)
            + "steps/s | train s | params (active / total) | diverged |",
            "|---|---|---|---|" + "---|" * len(result_keys) + "---|---|---|---|"]
    for label, s in stats.items():
        speed = "-" if s["steps_per_second"] is None else f"{s['steps_per_second']:.2f}"
        params = f"{format_params(s['active_params'])} / {format_params(s['num_params'])}"
        scores = "".join(f"{format_mean_std(s['results'].get(k, (None, None)))} | " for k in result_keys)
        rows.append(f"| {label} | {s['n']} | {format_mean_std(s['final_val_loss'])} | "
                    f"{format_mean_std(s['best_val_loss'])} | {scores}{speed} | "
                    f"{format_mean_std(s['train_seconds'], digits=0)} | {params} | "
                    f"{len(s['diverged'])}/{s['n']} |")
    return "\n".join(rows)


def mean_curve(runs: list[Run], key: str) -> tuple[np.ndarray, ...] | None:
    """(steps, mean, min, max) over the runs of the logged metric `key` at the steps every run logged it;
    None if none."""
    series = [{r["step"]: r[key] for r in run.records if key in r} for run in runs]
    steps = sorted(set.intersection(*(set(s) for s in series)))
    if not steps:
        return None
    values = np.array([[s[step] for step in steps] for s in series], np.float64)
    return np.array(steps), values.mean(0), values.min(0), values.max(0)


def final_value(run: Run, key: str) -> float | None:
    """A run's final value of a metric: its results.json score, else the last value it logged; None if neither."""
    if key in run.results:
        return run.results[key]
    logged = [r[key] for r in run.records if key in r]
    return logged[-1] if logged else None


def curve_against(runs: list[Run], key: str, against: str) -> tuple[np.ndarray, ...] | None:
    """(values of the config key `against`, mean, min, max) over the runs of each value of the metric `key`'s
    final value (final_value), for the values some run has it at, in increasing order; None if none has it."""
    finals: dict[float, list[float]] = {}
    for run in runs:
        value = final_value(run, key)
        if value is not None:
            finals.setdefault(float(run.config.get(against)), []).append(value)
    if not finals:
        return None
    xs = sorted(finals)
    return (np.array(xs), *(np.array([reduce(finals[x]) for x in xs]) for reduce in (np.mean, np.min, np.max)))


def save_against_plots(out: pathlib.Path, runs: list[Run], keys: list[str], against: str,
                       plot: list[str]) -> list[str]:
    """<metric>_by_<against>.png for each metric in plot: a line per group of runs by keys (curve_against); returns
    their names."""
    from lm.plots import save_loss_curves

    groups = group_runs(runs, keys)
    for key in plot:
        curves = {label: curve_against(group, key, against) for label, group in groups.items()}
        save_loss_curves(out / f"{key}_by_{against}.png", {label: c for label, c in curves.items() if c is not None},
                         key, title=f"final {key} (mean over seeds; band: min to max)",
                         xlabel=against, log_x=True)
    return [f"{key}_by_{against}.png" for key in plot]


def write_report(roots: list[pathlib.Path], out: pathlib.Path, groups: dict[str, list[Run]],
                 stats: dict[str, dict], spike: float, plot: list[str] = (), against: str | None = None) -> list[str]:
    """Writes report.md and the loss-curve plots (and one of each metric in plot) into out; returns the plots'
    names."""
    from lm.plots import save_loss_curves

    out.mkdir(parents=True, exist_ok=True)
    base = pathlib.Path(os.path.commonpath([root.absolute() for root in roots]))
    lines = [f"# Comparison of {sum(len(g) for g in groups.values())} runs in {', '.join(map(str, roots))}", "",
             table(stats), "",
             "Val loss: mean ± sample std (ddof=1) over seeds of the last (final) and lowest (best) eval_loss. "
             "steps/s: mean of the logged steps_per_second, each run's first logged interval left out. "
             "train s: seconds in the training loop (summary.json; compiles, evals and checkpoints included). "
             f"Diverged: a NaN/inf loss, or a logged train loss more than {spike:g} nat above the lowest "
             "logged before it. Plots: mean over seeds, band from min to max.", "",
             "![train loss](train_loss.png)", "", "![val loss](val_loss.png)", "",
             *(line for key in plot for line in (f"![{key}]({key}.png)", "")),
             *(line for key in (plot if against else ()) for line in (f"![{key}]({key}_by_{against}.png)", "")),
             "## Runs", ""]
    for label, runs in groups.items():
        lines.append(f"- {label}: " + ", ".join(f"`{run.path.absolute().relative_to(base)}`" for run in runs))
        lines += [f"  - diverged: `{name}`: {why}" for name, why in stats[label]["diverged"].items()]
    (out / REPORT_FILE).write_text("\n".join(lines) + "\n")
    plots = {"train_loss": ("loss", "train loss"), "val_loss": ("eval_loss", "val loss")}
    plots.update({key: (key, key) for key in plot})
    for file, (key, name) in plots.items():
        curves = {label: mean_curve(runs, key) for label, runs in groups.items()}
        save_loss_curves(out / f"{file}.png", {label: c for label, c in curves.items() if c is not None}, name,
                         title=f"{name} (mean over seeds; band: min to max)")
    return [f"{file}.png" for file in plots]


def compare(roots: str | list[str], out: str | None = None, group_by: list[str] | None = None,
            spike: float = SPIKE_NATS, plot: list[str] = (), against: str | None = None) -> dict[str, dict]:
    """Reads the runs under the root directories, prints the table and writes the report (into out,
    default the first root), with a plot of each metric in `plot` too (and against the config key `against`,
    save_against_plots); returns {group: stats}."""
    root_paths = [pathlib.Path(root) for root in ([roots] if isinstance(roots, str) else roots)]
    runs = [run for root in root_paths for run in find_runs(root)]
    keys = group_keys(runs) if group_by is None else list(group_by)
    if against:
        check_against(runs, against)
        keys = [key for key in keys if key != against]
    groups = group_runs(runs, [*keys, against] if against else keys)
    unlogged = [key for key in plot if not any(key in r for run in runs for r in run.records)
                and not (against and any(key in run.results for run in runs))]
    if unlogged:
        raise UserError(f"--plot: no run logged {', '.join(unlogged)} (see the keys in a run's metrics.jsonl)")
    stats = {label: group_stats(runs, spike) for label, runs in groups.items()}
    print(table(stats))
    out_path = pathlib.Path(out) if out else root_paths[0]
    plots = write_report(root_paths, out_path, groups, stats, spike, plot, against)
    if against:
        plots += save_against_plots(out_path, runs, keys, against, plot)
    print(f"done: the report in {shown_path(out_path / REPORT_FILE)}; plots in {shown_path(out_path)}: "
          f"{', '.join(plots)}")
    return stats


def check_against(runs: list[Run], against: str) -> None:
    """--against must name a config key that every run has as a number (UserError naming the first that has not)."""
    for run in runs:
        value = run.config.get(against)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UserError(f"--against={against}: the run {run.path} has {value!r} there, not a number; name a "
                            "numeric config key, e.g. data.max_train_examples")


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        fail("pass one or more directories of runs: lm compare runs/norm")
    run_user_errors(lambda: compare(argv[1:], _OUT.value, _GROUP_BY.value, _SPIKE.value, _PLOT.value, _AGAINST.value))


def run() -> None:
    """The command: flags from sys.argv, then main."""
    app.run(main, flags_parser=parse_flags)
