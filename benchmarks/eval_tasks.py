"""Benchmark: lm's task scoring (lm/eval) against lm-evaluation-harness's Hugging Face model on the same CPU.

  python benchmarks/eval_tasks.py --hf=/tmp/random_gpt [--tasks=hellaswag,lambada_openai] [--limit=200] \
      [--batch_size=32] [--harness_python=/tmp/refvenv/bin/python]

One run, side by side on this machine: the same Hugging Face folder (a GPT-2: GPT2LMHeadModel with its
tokenizer.json) scored on the same first --limit documents of each task (hellaswag, lambada_openai, winogrande,
piqa, arc_easy, arc_challenge), the model loaded first on each side, by
  lm       the command's path (`lm eval --hf=DIR --tasks=...`: lm/eval's Scorer, jitted, a multiple-choice
           document's context read once for all its choices, requests packed into rows, --batch_size rows a
           batch), report.evaluate timed twice per task: cold (the first pass, compiling its programs) and warm
           (a second pass);
  harness  lm-evaluation-harness's `hf` model (torch, float32, batches of --batch_size requests, sorted by length
           and padded to the longest), run by --harness_python (an environment with torch, transformers and
           lm-eval, as tests/fixtures/eval/make_fixtures.py's) in a subprocess: simple_evaluate timed per task
           (all: with the task's set-up and metrics) and the model's loglikelihood calls alone (scoring), the
           harness's own task YAMLs reading the same documents from local files.
Prints per task the documents per second of each, the ratios lm / harness (goal: at least 2) and both sides'
metrics (the same model on the same documents: they must agree). docs/evaluation.md has the figures.
"""

import gzip
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
FIXTURES_SCRIPT = REPO / "tests" / "fixtures" / "eval" / "make_fixtures.py"
SPLITS = {"hellaswag": "validation", "piqa": "validation", "winogrande": "validation"}  # else "test"


def harness_documents(task: str, limit: int, data_dir: pathlib.Path) -> list[dict]:
    """The first limit documents of task from lm's data files, in the fields of the Hugging Face dataset the
    harness's task YAML reads (as make_fixtures.py's make_data converts them)."""
    def rows(path: str) -> list[dict]:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(data_dir / path, "rt", encoding="utf-8") as f:
            return [json.loads(line) for line, _ in zip(filter(str.strip, f), range(limit), strict=False)]

    if task == "hellaswag":
        return rows("hellaswag/hellaswag_val.jsonl.gz")
    if task == "lambada_openai":
        return rows("lambada/lambada_test.jsonl")
    if task == "winogrande":
        return rows("winogrande/winogrande_dev.jsonl")
    if task == "piqa":
        labels = (data_dir / "piqa" / "valid-labels.lst").read_text().split()
        return [{**row, "label": int(label)} for row, label in zip(rows("piqa/valid.jsonl"), labels, strict=False)]
    if task in ("arc_easy", "arc_challenge"):
        found = []
        for row in rows(f"arc/{task}_test.jsonl"):
            labels = [chr(ord("A") + i) for i in range(len(row["choices"]))]
            found.append({"id": row["id"], "question": row["question"],
                          "choices": {"text": row["choices"], "label": labels}, "answerKey": labels[row["gold"]]})
        return found
    raise SystemExit(f"error: the benchmark converts hellaswag, lambada_openai, winogrande, piqa and arc_* for the "
                     f"harness, not {task!r}")


def harness_side(folder: str, tasks: list[str], limit: int, batch_size: int) -> dict:
    """(run by --harness_python) Each task scored by the harness's hf model: {task: {seconds, scoring_seconds,
    documents, metrics}}; scoring_seconds is the time in the model's loglikelihood calls (simple_evaluate's task
    set-up and metrics left out)."""
    import importlib.util

    import lm_eval
    from lm_eval.models.huggingface import HFLM

    os.environ["HF_DATASETS_OFFLINE"] = "1"
    spec = importlib.util.spec_from_file_location("eval_fixtures", FIXTURES_SCRIPT)
    fixtures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fixtures)
    model = HFLM(pretrained=folder, dtype="float32", device="cpu", batch_size=batch_size)
    scoring = [0.0]  # seconds in the model's loglikelihood calls

    def timed(method):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                scoring[0] += time.perf_counter() - start
        return call

    model.loglikelihood, model.loglikelihood_rolling = map(timed, (model.loglikelihood, model.loglikelihood_rolling))
    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        for task in tasks:
            split = SPLITS.get(task, "test")
            path = pathlib.Path(tmp) / f"{task}.jsonl"
            documents = harness_documents(task, limit, pathlib.Path(os.environ["LM_DATA_DIR"]))
            path.write_text("".join(json.dumps(document) + "\n" for document in documents))
            overrides = {"dataset_path": "json", "dataset_name": None,
                         "dataset_kwargs": {"data_files": {split: str(path)}}, "training_split": None,
                         **{f"{other}_split": None for other in ("validation", "test") if other != split}}
            config = next(c for c in fixtures.task_configs({t: overrides for t in fixtures.TASKS})
                          if c["task"] == task)
            scoring[0], start = 0.0, time.perf_counter()
            out = lm_eval.simple_evaluate(model=model, tasks=[config], bootstrap_iters=0, random_seed=0,
                                          numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)
            metrics = {name.removesuffix(",none"): value for name, value in out["results"][task].items()
                       if name.endswith(",none") and isinstance(value, float) and "stderr" not in name}
            found[task] = {"seconds": time.perf_counter() - start, "scoring_seconds": scoring[0],
                           "documents": len(documents), "metrics": metrics}
    return found


def lm_side(folder: str, tasks: list[str], limit: int, batch_size: int) -> dict:
    """Each task scored by lm as `lm eval --hf=folder --tasks=...` scores it, twice (cold: compiling; warm):
    {task: {cold_seconds, seconds, documents, metrics}}."""
    from lm.cli.resolve import load_hf
    from lm.eval import models, report
    from lm.eval.scoring import Scorer, gpt_apply
    from lm.eval.tasks import TASKS

    experiment, params, tokenizer, prefix = load_hf(folder)
    scorer = Scorer(gpt_apply(experiment.model), params, models.encoder(tokenizer),
                    experiment.config.data.context_length, prefix, batch_size)
    found = {}
    for task in tasks:
        (cold,) = report.evaluate(scorer, [TASKS[task]], limit)
        (warm,) = report.evaluate(scorer, [TASKS[task]], limit)
        found[task] = {"cold_seconds": cold.seconds, "seconds": warm.seconds, "documents": warm.documents,
                       "metrics": {metric: warm.metrics[metric] for metric in warm.task.metrics}}
    return found


def main(argv: list[str]) -> None:
    from absl import logging

    del argv
    logging.set_verbosity(logging.WARNING)
    folder, tasks, limit, batch_size = _HF.value, _TASKS.value.split(","), _LIMIT.value, _BATCH_SIZE.value
    print(f"{folder}: the first {limit} documents of {', '.join(tasks)}, batches of {batch_size}, "
          f"{os.cpu_count()} CPU cores")
    ours = lm_side(folder, tasks, limit, batch_size)
    command = [_HARNESS_PYTHON.value, __file__, "--harness_side", folder, ",".join(tasks), str(limit), str(batch_size)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"error: the harness side failed:\n{done.stderr[-3000:]}")
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    print("task | lm docs/s: cold, warm | harness docs/s: all, scoring | lm / harness: cold / all, warm / scoring "
          "| metrics: lm; harness")
    for task in tasks:
        a, b = ours[task], theirs[task]
        rates = [a["documents"] / a["cold_seconds"], a["documents"] / a["seconds"],
                 b["documents"] / b["seconds"], b["documents"] / b["scoring_seconds"]]
        print(f"{task} | {rates[0]:.1f}, {rates[1]:.1f} | {rates[2]:.1f}, {rates[3]:.1f} | "
              f"{rates[0] / rates[2]:.2f}x, {rates[1] / rates[3]:.2f}x | "
              f"{json.dumps(a['metrics'])}; {json.dumps(b['metrics'])}")


if __name__ == "__main__" and sys.argv[1:2] == ["--harness_side"]:  # the harness's environment: no lm, no absl
    folder, names, count, batch = sys.argv[2:6]
    print(json.dumps(harness_side(folder, names.split(","), int(count), int(batch))))
elif __name__ == "__main__":
    from absl import app, flags

    _HF = flags.DEFINE_string("hf", "/tmp/random_gpt", "A Hugging Face GPT-2 folder with its tokenizer.json.")
    _TASKS = flags.DEFINE_string("tasks", "hellaswag,lambada_openai", "Tasks, comma-separated.")
    _LIMIT = flags.DEFINE_integer("limit", 200, "The first N documents of each task.")
    _BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Requests per batch, on both sides.")
    _HARNESS_PYTHON = flags.DEFINE_string("harness_python", "/tmp/refvenv/bin/python",
                                          "A Python with torch, transformers and lm-eval.")
    app.run(main)
