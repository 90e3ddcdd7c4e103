"""Scaling laws: the fits recover the exponents of synthetic losses (with intervals that cover them), lm sweep's
size axis, the sizes and tokens a run records, and lm scaling on sweep folders written as lm sweep and lm train
write them."""

import json
import pathlib
import subprocess
import sys

import ml_collections
import numpy as np
import pytest

from lm import scaling
from lm.cli import scaling as scaling_cli
from lm.cli import sweep
from lm.errors import UserError
from lm.train.flops import non_embedding_params

REPO = pathlib.Path(__file__).resolve().parents[1]
SPEC = "configs/gpt_shakespeare.py:test"


def power_law_points(sizes, seeds: int, e: float, a: float, alpha: float, noise: float, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [(n, list(e + a * n**-alpha + rng.normal(0, noise, seeds))) for n in sizes]


def test_the_power_law_fit_recovers_the_exponent_and_its_interval_covers_it():
    points = power_law_points(np.geomspace(1e5, 1e8, 5), 4, e=1.5, a=40.0, alpha=0.3, noise=0.005)
    n, loss = scaling_cli.columns(points)
    fit = scaling.fit_power_law(n, loss)
    assert fit.params["alpha"] == pytest.approx(0.3, abs=0.02)
    assert fit(1e7) == pytest.approx(1.5 + 40.0 * 1e7**-0.3, abs=0.01)
    with_intervals = scaling.bootstrap(fit, points, scaling.fit_power_law, samples=100)
    for key, truth in (("alpha", 0.3), ("E", 1.5), ("A", 40.0)):
        low, high = with_intervals.intervals[key]
        assert low <= truth <= high, (key, low, high)
    assert with_intervals.intervals["alpha"][1] - with_intervals.intervals["alpha"][0] < 0.05
    assert with_intervals.params == fit.params
    assert scaling.bootstrap(fit, [(p[0], p[1][:1]) for p in points], scaling.fit_power_law).intervals == {}


def test_kaplans_exponent_is_recovered():
    """Kaplan et al. 2020's L(N) = (N_c / N)^0.076 (N_c = 8.8e13), no irreducible loss: E fits near 0."""
    points = power_law_points(np.geomspace(1e5, 1e9, 5), 2, e=0.0, a=8.8e13**0.076, alpha=0.076, noise=0.002)
    fit = scaling.fit_power_law(*scaling_cli.columns(points))
    assert fit.params["alpha"] == pytest.approx(0.076, abs=0.005)
    assert fit.params["E"] < 0.2


def test_a_fit_from_fewer_than_three_sizes_is_a_user_error():
    with pytest.raises(UserError, match=r"needs runs of 3 or more model sizes; these have 2 \(N = 1,000, 2,000\)"):
        scaling.fit_power_law([1e3, 1e3, 2e3], [3.0, 3.1, 2.9])


def chinchilla_loss(n, d):
    return 1.7 + 400 * n**-0.34 + 410 * d**-0.28  # Hoffmann et al. 2022's approach-3 fit


@pytest.mark.slow
def test_approach_3_recovers_both_exponents():
    sizes, tokens = np.geomspace(1e5, 1e8, 4), np.geomspace(1e7, 1e10, 4)
    rng = np.random.default_rng(0)
    n, d = (grid.ravel() for grid in np.meshgrid(sizes, tokens))
    fit = scaling.fit_chinchilla(n, d, chinchilla_loss(n, d) + rng.normal(0, 0.002, n.size))
    assert fit.params["alpha"] == pytest.approx(0.34, abs=0.03)
    assert fit.params["beta"] == pytest.approx(0.28, abs=0.03)
    assert fit.params["a"] == pytest.approx(0.28 / 0.62, abs=0.03)


def test_isoflop_minima_follow_the_compute_optimal_size():
    """Approach 2 on an IsoFLOP design (at each budget C, sizes within a decade each side of the optimum, with
    D = C / 6N) of approach 3's law: the minima follow its N_opt ~ C^(beta / (alpha + beta))."""
    a = 0.28 / 0.62
    n_opt = (0.34 * 400 / (0.28 * 410)) ** (1 / 0.62) * (np.array([1e18, 1e19, 1e20]) / 6) ** a
    n = np.concatenate([np.geomspace(opt / 10, opt * 10, 9) for opt in n_opt])
    c = np.repeat([1e18, 1e19, 1e20], 9)
    iso = scaling.isoflop_minima(n, c, chinchilla_loss(n, c / (6 * n)), num_budgets=3)
    assert len(iso.budgets) == 3 and all("N_opt" in b for b in iso.budgets)
    assert [b["N_opt"] for b in iso.budgets] == pytest.approx(n_opt, rel=0.3)
    assert iso.a == pytest.approx(a, abs=0.02)


def test_the_size_axis_sets_width_depth_and_heads():
    arms = sweep.plan_sweep(SPEC, {"size": ["32x2", "64x3", "pythia-14m"]}, {}, pathlib.Path("/nonexistent"))
    assert [arm.name for arm in arms] == ["size=32x2", "size=64x3", "size=pythia-14m"]
    assert arms[1].train_flags == {"model.embed_dim": "64", "model.num_layers": "3", "model.num_heads": "4",
                                   "model.num_kv_heads": "4"}  # the test config's head dimension: 16
    assert arms[2].train_flags["model.num_heads"] == "4" and arms[2].train_flags["model.num_layers"] == "6"
    grouped = ml_collections.ConfigDict({"embed_dim": 32, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
                                         "mlp_hidden_dim": 96})
    assert sweep.size_overrides("64x3", grouped) == {"model.embed_dim": "64", "model.num_layers": "3",
                                                     "model.num_heads": "8", "model.num_kv_heads": "4",
                                                     "model.mlp_hidden_dim": "192"}
    with pytest.raises(UserError, match="its 25 heads do not split into the config's groups of 2 query heads"):
        sweep.size_overrides("gpt2-xl", grouped)
    mup = {"model.parametrization": "mup", "model.mup_base_width": "32"}
    mup = sweep.plan_sweep(SPEC, {"size": ["32x2", "64x2"]}, mup, pathlib.Path("/nonexistent"))
    assert [arm.train_flags["model.mup_base_head_dim"] for arm in mup] == ["16", "16"]  # the widths grow the heads


@pytest.mark.parametrize("axes, overrides, message", [
    ({"size": ["30x2"]}, {}, "the width 30 is not a multiple of the config's head dimension 16"),
    ({"size": ["big"]}, {}, "write WIDTHxDEPTH .e.g. 256x4. or a named size .gpt2, "),
    ({"size": ["64x2"], "model.num_layers": ["2", "3"]}, {}, "sets model.num_layers: drop it"),
    ({"size": ["64x2"]}, {"model.num_kv_heads": "1"}, "sets model.num_kv_heads: drop it"),
])
def test_a_bad_size_is_one_line(axes, overrides, message):
    with pytest.raises(UserError, match=message):
        sweep.plan_sweep(SPEC, axes, overrides, pathlib.Path("/nonexistent"))


def test_a_run_records_its_sizes_and_tokens(trained_run):
    config, _, summary = trained_run
    tokens = summary["step"] * config.train.batch_size * config.data.context_length
    assert summary["tokens_seen"] == tokens
    assert summary["train_flops"] == pytest.approx(tokens * summary["flops_per_token"])
    assert 6 * summary["non_embedding_params"] < summary["flops_per_token"]
    tables = (128 + config.data.context_length) * config.model.embed_dim  # 65 characters padded to 128; positions
    assert summary["non_embedding_params"] == summary["num_params"] - tables


def test_non_embedding_parameters_leave_out_the_tables():
    params = {"token_embed": {"embedding": np.zeros((10, 4))}, "position_embed": {"embedding": np.zeros((8, 4))},
              "decoder": {"block_0": {"kernel": np.zeros((4, 4))}}, "lm_head": {"kernel": np.zeros((4, 10))}}
    assert non_embedding_params(params) == 16


def write_sweep(root: pathlib.Path, sizes=((64, 2), (128, 4), (256, 4)), steps=(100,), norms=("layer", "rms"),
                seeds=(0, 1), extra: dict | None = None) -> pathlib.Path:
    """Run folders as lm sweep and lm train write them (sweep.json; config.json, metrics.jsonl, summary.json per
    arm), losses from a known law: alpha 0.3 for layer, 0.4 for rms."""
    rng = np.random.default_rng(0)
    axes = {"model.norm": list(norms), "size": [f"{w}x{d}" for w, d in sizes], "seed": list(seeds)}
    if len(steps) > 1:
        axes["train.num_steps"] = list(steps)
    root.mkdir(parents=True)
    (root / "sweep.json").write_text(json.dumps({"config": SPEC, "axes": axes, "overrides": {}, "arms": []}))
    for k, norm in enumerate(norms):
        for (width, depth), num_steps, seed in ((s, t, r) for s in sizes for t in steps for r in seeds):
            n, tokens = 12 * depth * width**2, num_steps * 12 * 64
            loss = 1.5 + 200 * n ** -(0.3 + 0.1 * k) + 300 * tokens**-0.3 + rng.normal(0, 0.002)
            folder = root / f"model.norm={norm},size={width}x{depth},seed={seed},train.num_steps={num_steps}"
            folder.mkdir()
            config = {"seed": seed, "model": {"norm": norm, "embed_dim": width, "num_layers": depth,
                                              "num_heads": width // 16},
                      "train": {"num_steps": num_steps}, "optimizer": {"decay_steps": num_steps}, **(extra or {})}
            (folder / "config.json").write_text(json.dumps(config))
            (folder / "metrics.jsonl").write_text(json.dumps({"step": num_steps, "eval_loss": loss}) + "\n")
            (folder / "summary.json").write_text(json.dumps({
                "step": num_steps, "eval_loss": loss, "num_params": n + 129 * width, "non_embedding_params": n,
                "tokens_seen": tokens, "flops_per_token": 6 * n, "train_flops": 6 * n * tokens}))
    return root


def test_lm_scaling_prints_the_exponents_and_writes_the_plot(tmp_path, capsys):
    root = write_sweep(tmp_path / "sizes")
    (root / "model.norm=rms,size=64x2,seed=9,unfinished").mkdir()
    (root / "model.norm=rms,size=64x2,seed=9,unfinished" / "config.json").write_text("{}")
    result = scaling_cli.fit_scaling(str(root), samples=50)
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == "| arm | tokens | sizes (N) | seeds | E | A | alpha | L at the largest N |"
    assert lines[2].startswith("| model.norm=layer | - | 3 (98.3k-3.15M) | 2 | ")
    assert lines[3].startswith("| model.norm=rms | - | 3 (98.3k-3.15M) | 2 | ")
    assert [law["fit"].params["alpha"] for law in result["laws"]] == pytest.approx([0.3, 0.4], abs=0.03)
    assert lines[-1] == (f"done: 2 fits of L(N) from 12 runs; the report in {root / 'scaling.md'}; written: "
                         f"scaling.json, scaling_law.png in {root}")
    assert "left out 1 run" in err
    assert (root / "scaling_law.png").read_bytes().startswith(b"\x89PNG")
    assert json.loads((root / "scaling.json").read_text())["laws"][0]["intervals"]["alpha"]
    assert "![scaling_law.png](scaling_law.png)" in (root / "scaling.md").read_text()


@pytest.mark.slow
def test_lm_scaling_with_a_tokens_axis_fits_approaches_3_and_2(tmp_path, capsys):
    root = write_sweep(tmp_path / "sizes", sizes=((64, 2), (96, 2), (128, 2)), steps=(100, 300, 1000, 3000),
                       norms=("layer",), seeds=(0,))
    result = scaling_cli.fit_scaling(str(root), samples=0)
    out = capsys.readouterr().out
    assert [law["tokens"] for law in result["laws"]] == [76800, 230400, 768000, 2304000]
    assert result["approach3"][0]["fit"].params["beta"] == pytest.approx(0.3, abs=0.03)
    iso = result["isoflop"][0]["isoflop"]
    minima = [b for b in iso.budgets if "N_opt" in b]
    assert len(minima) >= 2 and iso.a is not None
    truth = [(200 / 300) ** (1 / 0.6) * (b["C"] / 6) ** 0.5 for b in minima]  # alpha = beta = 0.3
    assert [b["N_opt"] for b in minima] == pytest.approx(truth, rel=0.3)
    assert "Approach 3: L(N, D)" in out and "Approach 2 (IsoFLOP)" in out
    assert out.splitlines()[-1].endswith("written: scaling.json, scaling_law.png, isoflop.png, isoflop_optimum.png in "
                                         f"{root}")


def test_lm_scaling_refuses_too_few_sizes(tmp_path):
    root = write_sweep(tmp_path / "sizes", sizes=((64, 2), (128, 4)))
    with pytest.raises(UserError, match="the fit of L.N. for model.norm=layer: .* 3 or more model sizes; these have 2"):
        scaling_cli.fit_scaling(str(root), samples=0)
    assert not (root / "scaling.md").exists()


def test_lm_scaling_refuses_runs_that_differ_beyond_the_swept_keys(tmp_path):
    write_sweep(tmp_path / "sizes" / "a")
    write_sweep(tmp_path / "sizes" / "b", extra={"optimizer": {"learning_rate": 0.01, "decay_steps": 100}})
    with pytest.raises(UserError, match=r"the runs differ in optimizer.learning_rate beyond the swept keys "
                                        r"\(model.norm, model.embed_dim, model.num_layers, model.num_heads\): .*"
                                        r"name optimizer.learning_rate in --arms"):
        scaling_cli.fit_scaling(str(tmp_path / "sizes"), samples=0)
    result = scaling_cli.fit_scaling(str(tmp_path / "sizes"), arms=["model.norm", "optimizer.learning_rate"],
                                     samples=0)
    assert len(result["laws"]) == 4


@pytest.mark.slow
def test_the_command_reports_a_bad_directory_on_one_line(tmp_path):
    write_sweep(tmp_path / "sizes", sizes=((64, 2), (128, 4)))
    result = subprocess.run([sys.executable, "-m", "lm", "scaling", str(tmp_path / "sizes")], capture_output=True,
                            text=True, cwd=REPO)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].startswith("error: the fit of L(N) for model.norm=layer: ")


@pytest.mark.slow
def test_a_size_sweep_of_the_test_config_then_lm_scaling(tmp_path, data_dir, capsys):
    """Three sizes of real `lm train` runs (a few steps each): each arm's config has its size and its summary.json
    the counts lm scaling fits; then the fit."""
    from conftest import subprocess_env

    workdir = tmp_path / "sizes"
    result = subprocess.run(
        [sys.executable, "-m", "lm", "sweep", f"--config={SPEC}", "--sweep=size=16x1,32x1,48x2", f"--workdir={workdir}",
         "--parallel=2", "--config.train.num_steps=4", "--config.eval.every=4", "--config.eval.num_batches=1",
         "--config.sample.max_new_tokens=0"], cwd=REPO, env=subprocess_env(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr + result.stdout
    sizes = []
    for name, (width, depth, heads) in (("size=16x1", (16, 1, 1)), ("size=32x1", (32, 1, 2)),
                                        ("size=48x2", (48, 2, 3))):
        model = json.loads((workdir / name / "config.json").read_text())["model"]
        assert (model["embed_dim"], model["num_layers"], model["num_heads"], model["num_kv_heads"]) == (
            width, depth, heads, heads)
        summary = json.loads((workdir / name / "summary.json").read_text())
        assert summary["tokens_seen"] == 4 * 8 * 16
        sizes.append(summary["non_embedding_params"])
    assert sizes == sorted(sizes)
    fits = scaling_cli.fit_scaling(str(workdir), samples=0)
    assert [p[0] for p in fits["laws"][0]["points"]] == sizes
    assert capsys.readouterr().out.splitlines()[2].startswith("| all runs | - | 3 (")
