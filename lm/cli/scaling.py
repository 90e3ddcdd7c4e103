"""Fit scaling laws to a size sweep: the loss as a power law of the model size, with bootstrap intervals over seeds.

  lm scaling runs/sizes [more directories] [--arms=model.norm] [--params=non_embedding] [--bootstrap=1000]
      [--out=runs/sizes]

Reads every finished run under the directories (a folder with config.json and summary.json written by lm train,
e.g. the arms of `lm sweep --sweep=size=64x2,128x4,256x4 --sweep=seed=0,1,2`) and fits, per arm, the final eval
loss L against the model size N (--params: non_embedding, Kaplan et al. 2020's N, or total) as
L(N) = E + A N^-alpha (the Huber loss of log predictions, as Hoffmann et al. 2022 fit), with 95% intervals of
E, A and alpha from --bootstrap refits that draw each size's seeds with replacement (none with one seed a size).

Arms: runs with equal values of the --arms keys (default: the axes of the sweep.json files under the directories
other than the size, seed and tokens axes; without one, every config key the runs differ in but those). Runs
with more train.num_steps or train.batch_size form a tokens axis: a fit of L(N) for each token count D (the
tokens_seen of summary.json); with three or more token counts it also fits approach 3 of Hoffmann et al.,
L(N, D) = E + A / N^alpha + B / D^beta (compute-optimal N_opt ~ C^a, a = beta / (alpha + beta)), and approach 2:
at each FLOP budget (summary.json's train_flops) the loss-minimising size of a parabola in log N, and
N_opt ~ C^a fitted over the budgets.

It prints a table of the fits (and of approaches 3 and 2) and writes scaling.md, scaling.json (every fit and
its points) and scaling_law.png (log-log: each arm's points and fitted curve; with a tokens axis also
isoflop.png and isoflop_optimum.png) into --out (default: the first directory); its last line says where they
went. A fit from fewer than 3 sizes, and runs that differ in a config key beyond the arms, sizes, tokens and
seeds (a key whose value the others do not fix), are one-line errors.
"""

import dataclasses
import json
import pathlib
import sys

import numpy as np
from absl import app, flags

from lm import scaling
from lm.cli import define_string_once, parse_flags
from lm.errors import UserError, fail, run_user_errors
from lm.progress import shown_path
from lm.runs import CONFIG_FILE, CONFIG_REMEDY, SUMMARY_FILE, SUMMARY_REMEDY, SWEEP_FILE, flattened, read_json
from lm.scaling import SIZE_AXIS, SIZE_KEYS

TOKEN_KEYS = ("train.num_steps", "train.batch_size")  # what changes the tokens a run sees
PARAMS = {"non_embedding": "non_embedding_params", "total": "num_params"}  # --params: the summary.json count
REPORT_FILE = "scaling.md"
FITS_FILE = "scaling.json"

_OUT = define_string_once("out", "Where scaling.md, scaling.json and the plots go (default: the first directory).")
_ARMS = flags.DEFINE_list("arms", None, "Config keys whose values name an arm, one fit each (default: the sweep's "
                          "axes but size, seed and the tokens).")
_PARAMS = flags.DEFINE_enum("params", "non_embedding", list(PARAMS), "The model size N: parameters without the "
                            "token and position tables (Kaplan et al.), or all of them (Hoffmann et al.).")
_BOOTSTRAP = flags.DEFINE_integer("bootstrap", 1000, "Bootstrap refits for the 95% intervals (0: none).")


@dataclasses.dataclass
class Run:
    path: pathlib.Path
    config: dict  # flattened, lists as JSON strings (hashable)
    summary: dict


def find_runs(root: pathlib.Path) -> list[Run]:
    """Every finished run (config.json and summary.json with an eval_loss) at or under root, in path order; a
    warning line counts the run folders left out (unfinished or failed)."""
    if not root.is_dir():
        raise UserError(f"{root} is not a directory")
    folders = sorted(p.parent for p in root.rglob(CONFIG_FILE))
    runs, unfinished = [], []
    for folder in folders:
        summary_path = folder / SUMMARY_FILE
        summary = read_json(summary_path, SUMMARY_REMEDY) if summary_path.is_file() else {}
        if "eval_loss" not in summary:
            unfinished.append(folder.name)
            continue
        config = {k: json.dumps(v) if isinstance(v, list) else v
                  for k, v in flattened(read_json(folder / CONFIG_FILE, CONFIG_REMEDY)).items()}
        runs.append(Run(folder, config, summary))
    if unfinished:
        print(f"warning: left out {len(unfinished)} run{'s' * (len(unfinished) > 1)} under {root} without a final "
              f"eval loss in {SUMMARY_FILE} (unfinished or failed): {', '.join(unfinished)}", file=sys.stderr)
    if not runs:
        raise UserError(f"no finished runs under {root}: a run folder holds config.json and summary.json (from lm "
                        "train)")
    return runs


def swept_axes(roots: list[pathlib.Path]) -> list[str] | None:
    """The axis keys of the sweep.json files at or under roots, the size axis as the keys it sets; None if
    there is none."""
    records = [path for root in roots for path in sorted(root.rglob(SWEEP_FILE))]
    if not records:
        return None
    keys = []
    for path in records:
        for key in read_json(path, "run the sweep again to write it").get("axes", {}):
            for k in (SIZE_KEYS if key == SIZE_AXIS else (key,)):
                if k not in keys:
                    keys.append(k)
    return keys


def differing_keys(runs: list[Run]) -> list[str]:
    """The config keys whose values differ across the runs, seed left out."""
    keys = sorted({k for run in runs for k in run.config})
    return [k for k in keys if k != "seed" and len({repr(run.config.get(k)) for run in runs}) > 1]


def check_explained(runs: list[Run], explained: list[str]) -> None:
    """Every config key the runs differ in must be fixed by the explained keys' values (as the schedule's
    derived lengths are by train.num_steps): a UserError names the first that is not and two runs."""
    for key in differing_keys(runs):
        if key in explained:
            continue
        seen: dict[tuple, Run] = {}
        for run in runs:
            values = tuple(repr(run.config.get(k)) for k in explained)
            other = seen.setdefault(values, run)
            if repr(other.config.get(key)) != repr(run.config.get(key)):
                raise UserError(
                    f"the runs differ in {key} beyond the swept keys ({', '.join(explained) or 'none'}): "
                    f"{other.path} has {other.config.get(key)!r}, {run.path} has {run.config.get(key)!r}; fit the "
                    f"runs of one sweep, or name {key} in --arms")


def label(run: Run, keys: list[str]) -> str:
    return ",".join(f"{k}={run.config.get(k)}" for k in keys) or "all runs"


def size_of(run: Run, params: str) -> float:
    """The run's N, from its summary.json (a UserError for a run trained before lm recorded it)."""
    field = PARAMS[params]
    if field not in run.summary:
        raise UserError(f"{run.path / SUMMARY_FILE} has no {field}: the run was trained before lm recorded it; "
                        "use --params=total, or train it again")
    return float(run.summary[field])


def fact(run: Run, field: str) -> float:
    if field not in run.summary:
        raise UserError(f"{run.path / SUMMARY_FILE} has no {field}, which a tokens axis needs: the run was trained "
                        "before lm recorded it; train it again")
    return float(run.summary[field])


def points(runs: list[Run], *x) -> list[tuple]:
    """[(x values..., [losses over seeds])] per distinct x of the runs (x: a function of a run each)."""
    grouped: dict[tuple, list[float]] = {}
    for run in runs:
        grouped.setdefault(tuple(f(run) for f in x), []).append(float(run.summary["eval_loss"]))
    return [(*key, losses) for key, losses in sorted(grouped.items())]


def columns(point_list: list[tuple]) -> list[list[float]]:
    """The points as columns of one value a seed: [x..., losses]."""
    width = len(point_list[0])
    cols = [[] for _ in range(width)]
    for *xs, losses in point_list:
        for col, x in zip(cols[:-1], xs, strict=True):
            col.extend([x] * len(losses))
        cols[-1].extend(losses)
    return cols


def fit_size_law(point_list: list[tuple], samples: int, what: str) -> scaling.Fit:
    n, loss = columns(point_list)
    try:
        fit = scaling.fit_power_law(n, loss)
    except UserError as e:
        raise UserError(f"{what}: {e}") from e
    return scaling.bootstrap(fit, point_list, scaling.fit_power_law, samples)


def fit_runs(runs: list[Run], arm_keys: list[str], token_keys: list[str], params: str, samples: int) -> dict:
    """Every fit: {"laws": [L(N) per arm and token count], "approach3": [...], "isoflop": [...], "notes": [...]}."""
    arms: dict[str, list[Run]] = {}
    for run in runs:
        arms.setdefault(label(run, arm_keys), []).append(run)
    result = {"laws": [], "approach3": [], "isoflop": [], "notes": []}
    for arm, arm_runs in sorted(arms.items()):
        by_tokens: dict[str, list[Run]] = {}
        for run in arm_runs:
            by_tokens.setdefault(label(run, token_keys) if token_keys else "", []).append(run)
        tokens = {key: float(np.mean([fact(r, "tokens_seen") for r in group])) if token_keys else None
                  for key, group in by_tokens.items()}
        for tokens_label, group in sorted(by_tokens.items(), key=lambda item: tokens[item[0]] or 0):
            point_list = points(group, lambda r: size_of(r, params))
            what = f"the fit of L(N) for {arm}" + (f" at {tokens_label}" if token_keys else "")
            fit = fit_size_law(point_list, samples, what)
            result["laws"].append({"arm": arm, "tokens": tokens[tokens_label], "points": point_list, "fit": fit,
                                   "seeds": max(len(p[-1]) for p in point_list)})
        if not token_keys:
            continue
        counts = sorted({fact(r, "tokens_seen") for r in arm_runs})
        if len(counts) < 3:
            result["notes"].append(f"{arm}: approaches 2 and 3 need runs at 3 or more token counts, these have "
                                   f"{len(counts)}")
            continue
        point_list = points(arm_runs, lambda r: size_of(r, params), lambda r: fact(r, "tokens_seen"))
        fit = scaling.fit_chinchilla(*columns(point_list))
        fit = scaling.bootstrap(fit, point_list, scaling.fit_chinchilla, samples)
        result["approach3"].append({"arm": arm, "points": point_list, "fit": fit})
        n, c, loss = columns(points(arm_runs, lambda r: size_of(r, params), lambda r: fact(r, "train_flops")))
        iso = scaling.isoflop_minima(n, c, loss)
        result["isoflop"].append({"arm": arm, "isoflop": iso})
        if iso.a is None:
            result["notes"].append(f"{arm}: IsoFLOP: fewer than 2 FLOP budgets lie within the runs of 3 or more sizes "
                                   "with their loss minimum inside the sizes; give each size token counts whose FLOPs "
                                   "(about 6 N D) overlap the other sizes'")
    return result


def with_interval(fit: scaling.Fit, key: str, digits: str = ".4f") -> str:
    value = f"{fit.params[key]:{digits}}"
    if key in fit.intervals:
        low, high = fit.intervals[key]
        value += f" [{low:{digits}}, {high:{digits}}]"
    return value


def format_count(value: float) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def tables(result: dict) -> str:
    """The Markdown tables of the fits: L(N) per arm (and token count); approaches 3 and 2 where fitted."""
    rows = ["| arm | tokens | sizes (N) | seeds | E | A | alpha | L at the largest N |",
            "|---|---|---|---|---|---|---|---|"]
    for law in result["laws"]:
        fit, sizes = law["fit"], [p[0] for p in law["points"]]
        tokens = "-" if law["tokens"] is None else format_count(law["tokens"])
        rows.append(f"| {law['arm']} | {tokens} | {len(sizes)} ({format_count(min(sizes))}-{format_count(max(sizes))}) "
                    f"| {law['seeds']} | {with_interval(fit, 'E', '.3f')} | {with_interval(fit, 'A', '.3g')} | "
                    f"{with_interval(fit, 'alpha')} | {fit(max(sizes)):.4f} |")
    if result["approach3"]:
        rows += ["", "Approach 3: L(N, D) = E + A / N^alpha + B / D^beta; N_opt ~ C^a, D_opt ~ C^b", "",
                 "| arm | runs | E | alpha | beta | a | b |", "|---|---|---|---|---|---|---|"]
        for entry in result["approach3"]:
            fit = entry["fit"]
            rows.append(f"| {entry['arm']} | {sum(len(p[-1]) for p in entry['points'])} | "
                        f"{with_interval(fit, 'E', '.3f')} | {with_interval(fit, 'alpha')} | "
                        f"{with_interval(fit, 'beta')} | {with_interval(fit, 'a', '.3f')} | "
                        f"{with_interval(fit, 'b', '.3f')} |")
    if result["isoflop"]:
        rows += ["", "Approach 2 (IsoFLOP): the loss-minimising N at each FLOP budget C; N_opt ~ C^a", "",
                 "| arm | budgets (with a minimum) | a |", "|---|---|---|"]
        for entry in result["isoflop"]:
            iso = entry["isoflop"]
            found = sum("N_opt" in b for b in iso.budgets)
            exponent = "-" if iso.a is None else f"{iso.a:.3f}"
            rows.append(f"| {entry['arm']} | {len(iso.budgets)} ({found}) | {exponent} |")
    return "\n".join(rows + [f"\nnote: {note}" for note in result["notes"]])


def save_plots(out: pathlib.Path, result: dict, params: str) -> list[str]:
    """scaling_law.png (and with IsoFLOP budgets isoflop.png and isoflop_optimum.png) in out; their names."""
    from lm.plots import save_scaling_laws

    xlabel = f"{params.replace('_', '-')} parameters N"
    series = {}
    for law in result["laws"]:
        n, loss = columns(law["points"])
        curve = np.geomspace(min(n), max(n), 100)
        name = law["arm"] + ("" if law["tokens"] is None else f", D={format_count(law['tokens'])}")
        series[f"{name}: alpha={law['fit'].params['alpha']:.3f}"] = (n, loss, curve, law["fit"](curve))
    save_scaling_laws(out / "scaling_law.png", series, xlabel, title="L(N) = E + A N^-alpha (dots: runs)")
    names = ["scaling_law.png"]
    budgets, optima = {}, {}
    for entry in result["isoflop"]:
        iso = entry["isoflop"]
        for budget in iso.budgets:
            curve = np.geomspace(min(budget["N"]), max(budget["N"]), 100)
            p2, p1, p0 = budget["parabola"]
            x = np.log(curve)
            parabola = p0 + p1 * x + p2 * x * x
            budgets[f"{entry['arm']}: C={budget['C']:.2e}"] = (budget["N"], budget["L"], curve, parabola)
        minima = [b for b in iso.budgets if "N_opt" in b]
        if iso.a is not None:
            c = np.array([b["C"] for b in minima])
            optima[f"{entry['arm']}: a={iso.a:.3f}"] = (c, [b["N_opt"] for b in minima], c, iso.k * c**iso.a)
    if budgets:
        save_scaling_laws(out / "isoflop.png", budgets, xlabel, title="IsoFLOP: loss at each FLOP budget")
        names.append("isoflop.png")
    if optima:
        save_scaling_laws(out / "isoflop_optimum.png", optima, "training FLOPs C", ylabel="loss-minimising N",
                          title="N_opt ~ C^a (IsoFLOP minima)")
        names.append("isoflop_optimum.png")
    return names


def as_json(result: dict) -> dict:
    def fit_json(fit: scaling.Fit) -> dict:
        return {"params": fit.params, "intervals": fit.intervals}

    return {
        "laws": [{"arm": law["arm"], "tokens": law["tokens"], "points": law["points"], **fit_json(law["fit"])}
                 for law in result["laws"]],
        "approach3": [{"arm": e["arm"], "points": e["points"], **fit_json(e["fit"])} for e in result["approach3"]],
        "isoflop": [{"arm": e["arm"], **dataclasses.asdict(e["isoflop"])} for e in result["isoflop"]],
        "notes": result["notes"],
    }


def fit_scaling(roots: str | list[str], out: str | None = None, arms: list[str] | None = None,
                params: str = "non_embedding", samples: int = 1000) -> dict:
    """Reads the finished runs under the roots, fits them, prints the tables and writes the report, the fits and
    the plots into out (default: the first root); returns the fits (fit_runs)."""
    root_paths = [pathlib.Path(root) for root in ([roots] if isinstance(roots, str) else roots)]
    runs = [run for root in root_paths for run in find_runs(root)]
    differing = differing_keys(runs)
    unknown = [k for k in arms or () if not any(k in run.config for run in runs)]
    if unknown:
        raise UserError(f"--arms: no run's config has {', '.join(unknown)}")
    size_keys = [k for k in SIZE_KEYS if k in differing]
    token_keys = [k for k in TOKEN_KEYS if k in differing]
    if arms is None:
        axes = swept_axes(root_paths)
        arms = [k for k in (differing if axes is None else axes)
                if k in differing and k not in size_keys + token_keys]
    check_explained(runs, [*arms, *size_keys, *token_keys])
    result = fit_runs(runs, list(arms), token_keys, params, samples)
    report = tables(result)
    print(report)
    out_path = pathlib.Path(out) if out else root_paths[0]
    out_path.mkdir(parents=True, exist_ok=True)
    plots = save_plots(out_path, result, params)
    (out_path / FITS_FILE).write_text(json.dumps(as_json(result), indent=2) + "\n")
    intervals = f"95% intervals from {samples} bootstrap refits over seeds" if samples else "no intervals"
    lines = [f"# Scaling laws of {len(runs)} runs in {', '.join(map(str, root_paths))}", "",
             f"N: {params.replace('_', '-')} parameters; L: the final eval loss; {intervals} [low, high].", "",
             report, "", *(f"![{name}]({name})\n" for name in plots)]
    (out_path / REPORT_FILE).write_text("\n".join(lines))
    print(f"done: {len(result['laws'])} fits of L(N) from {len(runs)} runs; the report in "
          f"{shown_path(out_path / REPORT_FILE)}; written: {FITS_FILE}, {', '.join(plots)} in {shown_path(out_path)}")
    return result


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        fail("pass one or more directories of runs: lm scaling runs/sizes")
    if _BOOTSTRAP.value < 0:
        fail(f"--bootstrap={_BOOTSTRAP.value}: must be 0 or more")
    run_user_errors(lambda: fit_scaling(argv[1:], _OUT.value, _ARMS.value, _PARAMS.value, _BOOTSTRAP.value))


def run() -> None:
    """The command: flags from sys.argv, then main."""
    app.run(main, flags_parser=parse_flags)
