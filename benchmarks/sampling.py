"""Rollout sampling speed: lm's sample_completions against transformers' generate, the same weights, on CPU.

  python benchmarks/sampling.py [--batches=8x8,16x8,32x16] [--prompt=32] [--new=64] [--repeats=3]

Needs torch and transformers, which lm never depends on: run it in a separate environment, e.g.
  python -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu
  /tmp/hfvenv/bin/pip install transformers -e . && /tmp/hfvenv/bin/python benchmarks/sampling.py

The model is configs/gpt2.py:bpe_small (GPT-2 shaped: 4 layers, 4 heads, 128 wide, learned positions) with GPT-2's
50,257-id vocabulary, initialised in lm and exported to a GPT2LMHeadModel (lm/hf/export.py), so both sample from
the same weights. Each batch is prompts x G rows (G samples of each random prompt of --prompt tokens); both
sample --new tokens a row with nucleus sampling (temperature 1, top-p 0.9, no top-k) and a KV cache, with no end
token, so every row generates all of them. tokens/s counts the tokens generated (rows x new tokens, as each
returned them) in the best of --repeats calls, the two libraries' calls interleaved, after a warm-up call (the one
that compiles lm's program: its compile time is reported apart). First it checks that the two models' logits
agree. Prints a table and writes benchmarks/results/sampling.json.
"""

import datetime
import json
import os
import pathlib
import platform
import re
import tempfile
import time

import flax.linen as nn
import jax
import numpy as np
from absl import app, flags

from configs.gpt2 import get_config
from experiments.language_model import LanguageModel
from lm.decode.rollout import sample_completions
from lm.hf.export import hf_checkpoint
from lm.hf.files import write_folder

_BATCHES = flags.DEFINE_list("batches", ["8x8", "16x8", "32x16"], "Batches as prompts x G (samples per prompt).")
_PROMPT = flags.DEFINE_integer("prompt", 32, "Prompt tokens per row.")
_NEW = flags.DEFINE_integer("new", 64, "New tokens per row.")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Timed calls per library and batch (the best is kept).")
_TOP_P = flags.DEFINE_float("top_p", 0.9, "Nucleus sampling's probability mass.")
_OUT = flags.DEFINE_string("out", "benchmarks/results/sampling.json", "Where the JSON results go.")
VOCAB = 50257


def cpu_name() -> str:
    """The host CPU's model name (/proc/cpuinfo), or the machine type where there is none."""
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    found = re.search(r"model name\s*:\s*(.+)", cpuinfo.read_text()) if cpuinfo.exists() else None
    return found.group(1).strip() if found else platform.machine()


def build_models(context: int):
    """(lm's GPT, its params, the GPT2LMHeadModel holding the same weights)."""
    import torch
    from transformers import GPT2LMHeadModel

    config = get_config("bpe_small")
    config.data.update(vocab_size=VOCAB, context_length=context)
    experiment = LanguageModel(config, None)
    params = nn.unbox(jax.jit(experiment.init)(jax.random.key(0))["params"])
    hf, tensors = hf_checkpoint(config, jax.device_get(params), VOCAB)
    with tempfile.TemporaryDirectory() as folder:
        write_folder(pathlib.Path(folder), hf, tensors)
        torch_model = GPT2LMHeadModel.from_pretrained(folder, torch_dtype=torch.float32).eval()
    return experiment.model, params, torch_model


def logits_difference(model, params, torch_model) -> float:
    """The largest absolute difference between lm's and transformers' logits on a random row of 32 tokens."""
    import torch

    tokens = np.random.default_rng(1).integers(0, VOCAB, (1, 32), dtype=np.int32)
    ours = np.asarray(jax.jit(model.apply)({"params": params}, tokens))
    with torch.no_grad():
        theirs = torch_model(torch.from_numpy(tokens.astype(np.int64))).logits.numpy()
    return float(np.abs(ours - theirs).max())


def compile_seconds(call) -> float:
    """The seconds JAX spends tracing, lowering and compiling during call() (jax.monitoring's compile events)."""
    events = []

    def listen(event: str, seconds: float, **_):
        if event.startswith("/jax/core/compile/"):
            events.append(seconds)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        jax.block_until_ready(call())
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    return sum(events)


def timed(call) -> tuple[float, object]:
    """(seconds, result) of call(), its work finished."""
    start = time.perf_counter()
    result = jax.block_until_ready(call())
    return time.perf_counter() - start, result


def lm_sampler(model, params, prompts: np.ndarray, new: int):
    """seed -> lm's (tokens, completion_mask) of the prompts, no end token."""
    lengths = np.full((len(prompts),), prompts.shape[1], np.int32)
    return lambda seed: sample_completions(model, params, prompts, lengths, new, jax.random.key(seed), 1.0, 0,
                                           _TOP_P.value, None)


def hf_sampler(torch_model, prompts: np.ndarray, new: int):
    """seed -> transformers' generate's (B, P + new) ids of the prompts, no end token."""
    import torch

    def call(seed):
        torch.manual_seed(seed)
        with torch.no_grad():
            return torch_model.generate(torch.from_numpy(prompts.astype(np.int64)),
                                        attention_mask=torch.ones(prompts.shape, dtype=torch.int64),
                                        do_sample=True, temperature=1.0, top_k=0, top_p=_TOP_P.value,
                                        max_new_tokens=new, use_cache=True, eos_token_id=None, pad_token_id=0)
    return call


def measure(spec: str, model, params, torch_model, prompt: int, new: int) -> dict:
    """One batch (spec: prompts x G): both libraries' best tokens/s of --repeats calls, lm's compile time."""
    prompts_count, group = (int(n) for n in spec.split("x"))
    distinct = np.random.default_rng(0).integers(0, VOCAB, (prompts_count, prompt), dtype=np.int32)
    prompts = np.repeat(distinct, group, axis=0)  # (B, P): each prompt G times
    lm_call, hf_call = lm_sampler(model, params, prompts, new), hf_sampler(torch_model, prompts, new)
    compiling = compile_seconds(lambda: lm_call(0))  # the first call compiles
    lm_seconds, hf_seconds = [], []
    for seed in range(1, _REPEATS.value + 1):
        seconds, (_, mask) = timed(lambda seed=seed: lm_call(seed))
        lm_seconds.append(seconds)
        lm_tokens = int(np.asarray(mask).sum())
        seconds, out = timed(lambda seed=seed: hf_call(seed))
        hf_seconds.append(seconds)
        hf_tokens = len(prompts) * (out.shape[1] - prompt)
    row = {"prompts": prompts_count, "group": group, "rows": len(prompts), "lm_tokens": lm_tokens,
           "hf_tokens": hf_tokens, "lm_seconds": round(min(lm_seconds), 3), "hf_seconds": round(min(hf_seconds), 3),
           "lm_tokens_per_second": round(lm_tokens / min(lm_seconds)),
           "hf_tokens_per_second": round(hf_tokens / min(hf_seconds)),
           "lm_compile_seconds": round(compiling, 2)}
    row["speedup"] = round(row["lm_tokens_per_second"] / row["hf_tokens_per_second"], 2)
    return row


def main(argv):
    del argv
    import torch
    import transformers

    prompt, new = _PROMPT.value, _NEW.value
    model, params, torch_model = build_models(context=max(128, prompt + new))
    difference = logits_difference(model, params, torch_model)
    print(f"the same model: logits differ by at most {difference:.1e}")
    hf_sampler(torch_model, np.zeros((8, prompt), np.int32), 4)(0)  # a warm-up (transformers compiles nothing)
    rows = []
    for spec in _BATCHES.value:
        row = measure(spec, model, params, torch_model, prompt, new)
        rows.append(row)
        print(f"{spec:>6} ({row['rows']:4d} rows): lm {row['lm_tokens_per_second']:7,} tokens/s "
              f"({row['lm_seconds']:.2f} s; compile {row['lm_compile_seconds']:.1f} s)  "
              f"transformers {row['hf_tokens_per_second']:7,} tokens/s ({row['hf_seconds']:.2f} s)  "
              f"x{row['speedup']:.2f}", flush=True)

    results = {
        "date": datetime.date.today().isoformat(),
        "model": "configs/gpt2.py:bpe_small (4 layers, 4 heads, 128 wide), vocab 50257, float32",
        "logits_max_abs_difference": difference, "repeats": _REPEATS.value,
        "prompt_tokens": prompt, "new_tokens": new, "temperature": 1.0, "top_k": 0, "top_p": _TOP_P.value,
        "platform": jax.default_backend(), "cpu": cpu_name(), "cores": len(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "versions": {"jax": jax.__version__, "torch": torch.__version__, "transformers": transformers.__version__},
        "rows": rows,
    }
    out = pathlib.Path(_OUT.value)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    app.run(main)
