"""Collects the GRPO study's runs (run.sh) into this folder: held-out accuracy against steps and against wall time
(heldout_accuracy_by_step.png, heldout_accuracy_by_time.png: the mean over seeds, the band their min-max),
results.json and results.md (final val_accuracy per seed, mean ± std, wall times, SFT continued at the GRPO runs'
mean training time; val_accuracy by the length of the string).

    python experiments/studies/grpo_reverse/collect.py --runs=runs/grpo_reverse --out=experiments/studies/grpo_reverse

Held-out accuracy: greedy completions of the first 256 held-out prompts (heldout_accuracy, at every evaluation)
and of all 2,000 (val_accuracy, results.json). A GRPO run logs both itself; an SFT-continued run's checkpoints are
scored by GRPO runs of 0 steps in <run>/heldout/<step> (run.sh's heldout). Wall time: the run's elapsed_seconds at
each evaluation (from the start of its training loop: compilation, rollouts, evaluations and checkpoints included).
"""

import argparse
import collections
import json
import pathlib
import re
import statistics

import numpy as np

from lm.plots import save_loss_curves

SEEDS = (0, 1, 2)
GRPO_ARMS = {"GRPO": "grpo_s{seed}", "Dr. GRPO": "dr_grpo_s{seed}"}
SFT_RATES = ("1e-4", "3e-4")  # run.sh: SFT_LR and SFT_OTHER_LRS
RATES = "SFT continued: learning rates (seed 0), at the GRPO runs' mean training time"  # results.json's key


def jsonl(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def by_digits(completions: pathlib.Path) -> dict[int, float]:
    """The held-out accuracy of a completions.jsonl by the length of the string reversed (its prompt's digits)."""
    scores = collections.defaultdict(list)
    for row in jsonl(completions):
        scores[len(re.search(r"Question: (\d+)", row["prompt"]).group(1))].append(row["answer"])
    return {digits: statistics.mean(values) for digits, values in sorted(scores.items())}


def grpo_curve(run: pathlib.Path) -> dict:
    """A GRPO run's held-out accuracy at each evaluation: steps, accuracy, elapsed seconds; its val_accuracy and
    the final accuracy by digits."""
    rows = [row for row in jsonl(run / "metrics.jsonl") if "heldout_accuracy" in row]
    return {"steps": [row["step"] for row in rows], "accuracy": [row["heldout_accuracy"] for row in rows],
            "seconds": [row["elapsed_seconds"] for row in rows],
            "val_accuracy": json.loads((run / "results.json").read_text())["val_accuracy"],
            "by_digits": by_digits(run / "completions.jsonl")}


def sft_curve(run: pathlib.Path, base: pathlib.Path) -> dict:
    """An SFT-continued run's checkpoints scored as GRPO scores them (heldout/<step>; step 0: the base's, scored in
    base): steps, accuracy (256 prompts), val_accuracy (all 2,000) and the run's elapsed seconds at each (its
    evaluation at that step)."""
    seconds = {row["step"]: row["elapsed_seconds"] for row in jsonl(run / "metrics.jsonl") if "elapsed_seconds" in row}
    folders = {0: base} | {int(path.name): path for path in (run / "heldout").iterdir()}
    steps = sorted(folders)
    scored = [jsonl(folders[step] / "metrics.jsonl")[0] for step in steps]
    finals = [json.loads((folders[step] / "results.json").read_text()) for step in steps]
    return {"steps": steps, "accuracy": [row["heldout_accuracy"] for row in scored], "folders": folders,
            "seconds": [seconds[step] for step in steps], "val_accuracies": [row["val_accuracy"] for row in finals]}


def at_time(curve: dict, seconds: float) -> dict:
    """An SFT-continued curve's last checkpoint reached within seconds: its step, elapsed seconds, val_accuracy,
    and the best val_accuracy of the checkpoints up to it (a choice made on the held-out set: SFT's best case)."""
    last = max(i for i, elapsed in enumerate(curve["seconds"]) if elapsed <= seconds)
    step = curve["steps"][last]
    return {"step": step, "seconds": curve["seconds"][last], "val_accuracy": curve["val_accuracies"][last],
            "best_val_accuracy": max(curve["val_accuracies"][:last + 1]),
            "by_digits": by_digits(curve["folders"][step] / "completions.jsonl")}


def band(curves: list[dict], x: str) -> tuple[np.ndarray, ...]:
    """(x: the mean over seeds, the mean accuracy, the min, the max) at each evaluation the seeds share."""
    count = min(len(curve["accuracy"]) for curve in curves)
    xs = np.mean([curve[x][:count] for curve in curves], axis=0)
    accuracy = np.array([curve["accuracy"][:count] for curve in curves])
    return xs, accuracy.mean(0), accuracy.min(0), accuracy.max(0)


def summary(values: list[float]) -> dict:
    return {"per_seed": values, "mean": statistics.mean(values), "std": statistics.stdev(values)}


def mean_by_digits(points: list[dict]) -> dict[int, float]:
    """The mean over seeds of each string length's accuracy."""
    return {digits: statistics.mean(point["by_digits"][digits] for point in points)
            for digits in points[0]["by_digits"]}


def walls(runs: pathlib.Path) -> dict[str, float]:
    """Each command's wall time in seconds (run.sh's walls.txt: NAME SECONDS lines; the last of a name wins)."""
    lines = (runs / "walls.txt").read_text().split("\n")
    return {name: float(value) for name, value in (line.split() for line in lines if line.strip())}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="runs/grpo_reverse", type=pathlib.Path)
    parser.add_argument("--out", default="experiments/studies/grpo_reverse", type=pathlib.Path)
    parser.add_argument("--sft_rate", default="1e-4", help="the SFT-continued arm's rate (its 3 seeds)")
    args = parser.parse_args()
    runs, wall = args.runs, walls(args.runs)
    base = args.runs / "sft_reverse_heldout"
    results = {"base": {"heldout_accuracy": jsonl(base / "metrics.jsonl")[0]["heldout_accuracy"],
                        "val_accuracy": json.loads((base / "results.json").read_text())["val_accuracy"],
                        "wall_seconds": wall["sft_reverse"]}}
    curves = {}
    for arm, pattern in GRPO_ARMS.items():
        names = [pattern.format(seed=seed) for seed in SEEDS]
        curves[arm] = [grpo_curve(runs / name) for name in names]
        results[arm] = {"val_accuracy": summary([curve["val_accuracy"] for curve in curves[arm]]),
                        "train_seconds": summary([curve["seconds"][-1] for curve in curves[arm]]),
                        "command_seconds": summary([wall[name] for name in names]),
                        "steps": curves[arm][0]["steps"][-1], "accuracy_by_digits": mean_by_digits(curves[arm])}
    budget = results["GRPO"]["train_seconds"]["mean"]
    sft = {}
    for rate in SFT_RATES:  # seed 0 at each rate, seeds 1 and 2 at the arm's
        for seed in SEEDS:
            run = runs / f"sft_lr{rate}_s{seed}"
            if run.is_dir():
                sft[rate, seed] = sft_curve(run, base)
    results[RATES] = {
        rate: at_time(curve, budget) for (rate, seed), curve in sft.items() if seed == 0}
    curves["SFT continued"] = [sft[args.sft_rate, seed] for seed in SEEDS]
    chosen = [at_time(curve, budget) for curve in curves["SFT continued"]]
    results["SFT continued"] = {
        "learning_rate": float(args.sft_rate), "grpo_mean_train_seconds": budget,
        "val_accuracy": summary([point["val_accuracy"] for point in chosen]),
        "best_val_accuracy": summary([point["best_val_accuracy"] for point in chosen]),
        "steps": [point["step"] for point in chosen],
        "train_seconds": summary([point["seconds"] for point in chosen]),
        "command_seconds": summary([wall[f"sft_lr{args.sft_rate}_s{seed}"] for seed in SEEDS]),
        "accuracy_by_digits": mean_by_digits(chosen)}
    results["base"]["accuracy_by_digits"] = by_digits(base / "completions.jsonl")
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "results.md").write_text(table(results))
    labels = {arm: f"{arm} (3 seeds)" for arm in curves}
    labels["SFT continued"] = f"SFT continued, lr {args.sft_rate} (3 seeds)"
    for x, name, xlabel in (("steps", "step", "step"), ("seconds", "time", "seconds of training")):
        save_loss_curves(args.out / f"heldout_accuracy_by_{name}.png",
                         {labels[arm]: band(arm_curves, x) for arm, arm_curves in curves.items()},
                         "held-out greedy accuracy (256 prompts)", xlabel=xlabel,
                         title=f"reversing digit strings: held-out accuracy by {name}")
    print(table(results))


def table(results: dict) -> str:
    """The markdown table: each arm's val_accuracy per seed, mean ± std, steps and wall times."""
    base = results["base"]
    lines = ["| arm | steps | val_accuracy (seeds 0, 1, 2) | mean ± std | training s (mean) | command s (mean) |",
             "|---|---|---|---|---|---|",
             f"| SFT base (the start) | 70 | {base['val_accuracy']:.4f} | | | {base['wall_seconds']:.0f} |"]
    for arm in ("GRPO", "Dr. GRPO", "SFT continued"):
        row = results[arm]
        steps = row["steps"] if isinstance(row["steps"], int) else ", ".join(map(str, row["steps"]))
        accuracy = row["val_accuracy"]
        lines.append(f"| {arm} | {steps} | {', '.join(f'{v:.4f}' for v in accuracy['per_seed'])} | "
                     f"{accuracy['mean']:.4f} ± {accuracy['std']:.4f} | {row['train_seconds']['mean']:.0f} | "
                     f"{row['command_seconds']['mean']:.0f} |")
    best = results["SFT continued"]["best_val_accuracy"]
    lines.append(f"| SFT continued, the best checkpoint up to then | | "
                 f"{', '.join(f'{v:.4f}' for v in best['per_seed'])} | {best['mean']:.4f} ± {best['std']:.4f} | | |")
    lines += ["", "SFT continued, seed 0, at the GRPO runs' mean training time:", "",
              "| learning rate | step | val_accuracy | the best checkpoint's up to then |", "|---|---|---|---|"]
    for rate, row in results[RATES].items():
        lines.append(f"| {rate} | {row['step']} | {row['val_accuracy']:.4f} | {row['best_val_accuracy']:.4f} |")
    digits = list(results["base"]["accuracy_by_digits"])
    lines += ["", "val_accuracy by the length of the string (mean over seeds):", "",
              "| arm | " + " | ".join(f"{n} digits" for n in digits) + " |", "|---" * (len(digits) + 1) + "|"]
    for arm in ("base", "GRPO", "Dr. GRPO", "SFT continued"):
        shares = results[arm]["accuracy_by_digits"]
        lines.append(f"| {arm} | " + " | ".join(f"{shares[n]:.3f}" for n in digits) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
