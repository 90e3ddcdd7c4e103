"""The mutransfer study's figure and tables, from its two finished sweeps (not a sweep file: it has no axes).

  python experiments/studies/mutransfer/figure.py runs/mutransfer_standard \
      runs/mutransfer_mup --out=experiments/studies/mutransfer

Reads each sweep's sweep.json and every arm's summary.json (the final eval loss) and writes into --out:
mutransfer.png (Tensor Programs V's Figure 1: the final val loss against log2 of the learning rate, one curve
per width, a panel per sweep), results.json (every loss, each width's best learning rate, the widest model at the
narrowest one's best rate) and results.md (the same as tables).
"""

import argparse
import json
import math
import pathlib

NAMES = {"standard": "standard", "mup": "μP"}  # model.parametrization's values as the figure and tables name them

def read_sweep(workdir: pathlib.Path) -> dict:
    """{"parametrization": name, "losses": {width: {lr: final eval loss (nan: unfinished or diverged)}}}."""
    sweep = json.loads((workdir / "sweep.json").read_text())
    parametrization = sweep["overrides"].get("model.parametrization", "standard")
    losses: dict[int, dict[float, float]] = {}
    for arm in sweep["arms"]:
        width = int(str(arm["overrides"]["size"]).split("x")[0])
        rate = float(arm["overrides"]["optimizer.learning_rate"])
        summary = pathlib.Path(arm["workdir"]) / "summary.json"
        loss = json.loads(summary.read_text()).get("eval_loss", math.nan) if summary.exists() else math.nan
        losses.setdefault(width, {})[rate] = float(loss)
    return {"parametrization": parametrization, "losses": losses}


def best_rate(losses: dict[float, float]) -> float:
    """The learning rate with the lowest finite loss."""
    return min((loss, rate) for rate, loss in losses.items() if math.isfinite(loss))[1]


def summarise(sweep: dict) -> dict:
    """Each width's best rate; the widest model's loss at the narrowest one's best rate and at its own; at how
    many rates every wider model beat the narrower ones."""
    losses = sweep["losses"]
    widths = sorted(width for width, row in losses.items() if any(map(math.isfinite, row.values())))
    rates = sorted(losses[widths[0]])
    best = {width: best_rate(losses[width]) for width in widths}
    narrow, wide = widths[0], widths[-1]
    wider_better = [rate for rate in rates
                    if all(losses[a][rate] > losses[b][rate] for a, b in zip(widths, widths[1:], strict=False))]
    return {
        "parametrization": sweep["parametrization"],
        "widths": widths,
        "learning_rates": rates,
        "losses": {str(width): {str(rate): losses[width][rate] for rate in rates} for width in widths},
        "best_learning_rate": {str(width): best[width] for width in widths},
        "best_log2_learning_rate": {str(width): math.log2(best[width]) for width in widths},
        "widest_at_narrowest_best": losses[wide][best[narrow]],
        "widest_at_own_best": losses[wide][best[wide]],
        "rates_where_wider_is_better": wider_better,
    }


def markdown(results: list[dict]) -> str:
    lines = ["# μTransfer: final val loss by width and learning rate", ""]
    for result in results:
        rates, widths = result["learning_rates"], result["widths"]
        lines += [f"## {NAMES[result['parametrization']]}", "",
                  "| width | " + " | ".join(f"2^{math.log2(rate):.0f}" for rate in rates) + " | best rate |",
                  "|---" * (len(rates) + 2) + "|"]
        for width in widths:
            row = result["losses"][str(width)]
            best = result["best_learning_rate"][str(width)]
            cells = [f"**{row[str(rate)]:.4f}**" if rate == best else f"{row[str(rate)]:.4f}" for rate in rates]
            lines.append(f"| {width} | " + " | ".join(cells) + f" | 2^{math.log2(best):.0f} ({best:.2e}) |")
        lines += ["", f"Width {widths[-1]} at width {widths[0]}'s best rate: {result['widest_at_narrowest_best']:.4f};"
                      f" at its own best: {result['widest_at_own_best']:.4f}. Rates at which every wider model beat "
                      f"the narrower ones: {len(result['rates_where_wider_is_better'])} of {len(rates)}.", ""]
    return "\n".join(lines)


def plot(path: pathlib.Path, results: list[dict]) -> None:
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(5.0 * len(results), 4.2), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(results), sharey=True, squeeze=False)[0]
    finite = [loss for result in results for row in result["losses"].values() for loss in row.values()
              if math.isfinite(loss)]
    for ax, result in zip(axes, results, strict=True):
        for i, width in enumerate(result["widths"]):
            row = result["losses"][str(width)]
            rates = result["learning_rates"]
            colour = colormaps["viridis"](i / max(len(result["widths"]) - 1, 1))
            ax.plot([math.log2(rate) for rate in rates], [row[str(rate)] for rate in rates], marker="o",
                    color=colour, label=f"width {width}")
        ax.set_title(NAMES[result["parametrization"]])
        ax.set_xlabel("log2 learning rate")
        ax.set_ylim(min(finite) - 0.05, min(max(finite), min(finite) + 1.2) + 0.05)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("final val loss")
    axes[-1].legend()
    figure.savefig(path, format="png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweeps", nargs="+", type=pathlib.Path, help="the sweeps' workdirs, one panel each")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("."), help="where the files go")
    args = parser.parse_args()
    results = [summarise(read_sweep(workdir)) for workdir in args.sweeps]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "results.md").write_text(markdown(results))
    plot(args.out / "mutransfer.png", results)
    print(f"wrote mutransfer.png, results.json and results.md into {args.out}")


if __name__ == "__main__":
    main()
