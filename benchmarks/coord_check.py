"""μP's coordinate check (Yang et al. 2022, Tensor Programs V; as the `mup` library draws it).

  python benchmarks/coord_check.py [--widths=64,128,256,512,1024] [--steps=5] [--out=benchmarks/results]

Trains a small GPT (2 blocks, 4 heads, tied embeddings, the gpt2 init) at each width for `steps` Adam steps at a
fixed learning rate, under the standard parametrization and under μP (base width the smallest width), and after
each step t = 1 .. steps records the RMS of every layer's output on a fixed batch: the token embedding, each
block's attention and MLP outputs, the logits. Under μP every curve is flat in the width (the slope of log RMS
against log width is near 0); under the standard parametrization the updates of the wide models blow the
activations up. Writes coord_check.png (one panel per parametrization and step, RMS
against width) and coord_check.json (the RMS, the slopes, the wall time) to --out, and prints the slopes.
"""

import json
import pathlib
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import app, flags

from lm.models.config import transformer_config, transformer_options
from lm.models.gpt import GPT, GPTConfig
from lm.train.optim import make_optimizer, resolve_schedule
from lm.train.options import optimizer_options, train_options

VOCAB = 64
BATCH, LENGTH = 8, 32
LEARNING_RATE = 5e-3  # large enough that the standard parametrization's updates blow up the wide models


def model_section(parametrization: str, width: int, base_width: int, num_layers: int):
    """The `model` section of the checked GPT at width (4 heads: the head dimension grows with the width)."""
    return transformer_options(num_layers=num_layers, num_heads=4, num_kv_heads=4, embed_dim=width,
                               parametrization=parametrization, mup_base_width=base_width)


def batches(steps: int, seed: int = 0) -> np.ndarray:
    """steps + 1 batches of Zipf-distributed tokens (BATCH, LENGTH + 1): something to learn."""
    probabilities = 1 / np.arange(1, VOCAB + 1)
    rng = np.random.default_rng(seed)
    return rng.choice(VOCAB, size=(steps + 1, BATCH, LENGTH + 1), p=probabilities / probabilities.sum())


def layer_name(path: tuple[str, ...]) -> str | None:
    """The checked layer a captured intermediate's path names, or None."""
    if path == ("token_embed", "__call__"):
        return "embedding"
    if path == ("__call__",):  # the head's, in GPT's scope (nn.share_scope)
        return "logits"
    if len(path) == 4 and path[0] == "decoder" and path[2] in ("attention", "mlp") and path[3] == "__call__":
        return f"block {path[1].removeprefix('block_')} {path[2]}"
    return None


ORDER = {"embedding": 0, "logits": 2}


def coordinates(parametrization: str, width: int, base_width: int, steps: int, learning_rate: float,
                num_layers: int = 2, seed: int = 0) -> dict[str, list[float]]:
    """{layer: [RMS of its output after step 1, ..., after step `steps`]} of the GPT at width."""
    model_cfg = model_section(parametrization, width, base_width, num_layers)
    model = GPT(GPTConfig(VOCAB, LENGTH, transformer_config(model_cfg)))
    config = optimizer_options(learning_rate=learning_rate, schedule="constant", warmup_steps=0, weight_decay=0.0,
                               grad_clip_norm=1e9)  # no clipping: it would rescale the gradients by width
    run = ml_collections.ConfigDict({"optimizer": config, "train": train_options(num_steps=steps)})
    optimizer = make_optimizer(resolve_schedule(run).optimizer, model_cfg)
    data = jnp.asarray(batches(steps, seed))
    params = model.init(jax.random.key(seed), data[0, :, :-1])["params"]
    opt_state = optimizer.init(params)

    def layers(module, method: str) -> bool:  # what capture_intermediates keeps
        return method == "__call__" and module.name in ("token_embed", "attention", "mlp", "head")

    @jax.jit
    def step(params, opt_state, tokens):  # one update; the RMS of each layer's output in its forward pass
        def loss(p):
            losses, state = model.apply({"params": p}, tokens[:, :-1], targets=tokens[:, 1:],
                                        capture_intermediates=layers, mutable=["intermediates"])
            return losses.mean(), state["intermediates"]

        grads, captured = jax.grad(loss, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        rms = {}
        for path, value in jax.tree_util.tree_flatten_with_path(captured)[0]:
            name = layer_name(tuple(key.key for key in path if hasattr(key, "key")))
            if name is not None:
                rms[name] = jnp.sqrt(jnp.mean(jnp.square(value.astype(jnp.float32))))
        return optax.apply_updates(params, updates), opt_state, rms

    record: dict[str, list[float]] = {}
    for t in range(steps + 1):  # the forward pass of step t + 1 follows t updates: record t = 1 .. steps
        params, opt_state, rms = step(params, opt_state, data[t])
        for name, value in rms.items():
            if t:
                record.setdefault(name, []).append(float(value))
    return dict(sorted(record.items(), key=lambda item: ORDER.get(item[0], 1)))  # embedding, blocks, logits


def slopes(widths: list[int], rms: dict[str, list[list[float]]]) -> dict[str, list[float]]:
    """{layer: [slope of log RMS against log width at each step]}; rms[layer][i][t]: width i, step t."""
    x = np.log(widths)
    return {layer: [float(np.polyfit(x, np.log(per_width[:, t]), 1)[0]) for t in range(per_width.shape[1])]
            for layer, per_width in ((layer, np.asarray(values)) for layer, values in rms.items())}


def coord_check(widths: list[int], steps: int, learning_rate: float, num_layers: int = 2) -> dict:
    """{parametrization: {"rms": {layer: [[RMS at step t] per width]}, "slopes": {layer: [slope per step]}}}, μP with
    base width widths[0]."""
    result = {}
    for parametrization in ("standard", "mup"):
        runs = [coordinates(parametrization, width, widths[0], steps, learning_rate, num_layers) for width in widths]
        rms = {layer: [run[layer] for run in runs] for layer in runs[0]}
        result[parametrization] = {"rms": rms, "slopes": slopes(widths, rms)}
    return result


def plot(path: pathlib.Path, widths: list[int], result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = len(next(iter(result["standard"]["rms"].values()))[0])
    figure, axes = plt.subplots(2, steps, figsize=(3 * steps, 6), sharey="row", squeeze=False)
    for row, (parametrization, title) in enumerate((("standard", "standard"), ("mup", "μP"))):
        for t in range(steps):
            ax = axes[row][t]
            for layer, per_width in result[parametrization]["rms"].items():
                ax.plot(widths, [values[t] for values in per_width], marker=".", label=layer)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{title}, step {t + 1}", fontsize=9)
            ax.set_xlabel("width")
        axes[row][0].set_ylabel("RMS of the layer's output")
    axes[0][-1].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def define_flags() -> None:
    """The script's flags, defined when it runs (not on import: the tests import coord_check beside lm's commands,
    whose --out they would clash with)."""
    flags.DEFINE_list("widths", ["64", "128", "256", "512", "1024"], "model widths (embed_dim); the first is μP's "
                                                                      "base width")
    flags.DEFINE_integer("steps", 5, "Adam steps; the activations are recorded after each")
    flags.DEFINE_float("learning_rate", LEARNING_RATE, "Adam's constant learning rate (μP: at the base width)")
    flags.DEFINE_string("out", "benchmarks/results", "folder for coord_check.png and coord_check.json")


def main(argv):
    del argv
    values = flags.FLAGS
    widths = [int(width) for width in values.widths]
    start = time.perf_counter()
    result = coord_check(widths, values.steps, values.learning_rate)
    wall = time.perf_counter() - start
    out = pathlib.Path(values.out)
    out.mkdir(parents=True, exist_ok=True)
    plot(out / "coord_check.png", widths, result)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               jax.devices()[0].device_kind) if pathlib.Path("/proc/cpuinfo").exists() else jax.devices()[0].device_kind
    summary = {"widths": widths, "steps": values.steps, "learning_rate": values.learning_rate, "wall_s": round(wall, 1),
               "device": f"{jax.default_backend()}: {cpu}", **result}
    (out / "coord_check.json").write_text(json.dumps(summary, indent=1) + "\n")
    for parametrization in ("standard", "mup"):
        print(f"{parametrization}: slope of log RMS against log width, steps 1..{values.steps}")
        for layer, per_step in result[parametrization]["slopes"].items():
            print(f"  {layer:18s} " + " ".join(f"{slope:+.2f}" for slope in per_step))
    print(f"wall time {wall:.0f} s; wrote {out / 'coord_check.png'} and {out / 'coord_check.json'}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
