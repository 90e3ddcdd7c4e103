"""Evaluate a run's checkpoint: its eval metrics, evaluators and held-out results.

  lm eval --workdir=runs/baby [--step=1000] [--out=runs/baby/eval_1000]

Runs every evaluation the trainer runs, on the checkpoint at --step (default: the latest) of the run in
--workdir, with the run's saved config and on its mesh (jitted, sharded as in training): the loss and
metrics of the eval data (eval_*, with the experiment's scores of that pass, e.g. dev_accuracy), the
experiment's evaluators (val_bleu, ...) and its held-out final results (test BLEU, test accuracy, ...).
Prints them and writes them to <out>/eval.json, with any files the final results write (decoded test
sentences, plots); --out defaults to <workdir>/eval_<step>, so the run's own files stay as they are.
The run's data is read again (the run's data cache and tokenizers are reused where it saved them).

  lm eval --workdir=RUN | --hf=DIR --tasks=hellaswag,lambada_openai,arc_easy,arc_challenge,piqa,winogrande,wikitext \
      [--limit=N] [--hf_tokenizer=tokenizer.json] [--batch_size=32] [--out=DIR]

With --tasks: the standard zero-shot tasks scored as lm-evaluation-harness scores them (lm/eval, docs/evaluation.md),
on the first --limit documents of each (default: all), from $LM_DATA_DIR; the model is the run's GPT at --step (its
BPE tokenizer, or its characters one by one; restored on the run's mesh, the batches split over its batch axes as
the eval loss's are) or the Hugging Face folder --hf (GPT-2 or Llama, with its tokenizer.json or --hf_tokenizer).
passkey:LENGTH (lm/eval/passkey.py) is synthetic: --limit documents (default 100) of filler LENGTH tokens long
hiding a five-digit key, retrieved when the key is the model's greedy continuation (acc, and acc by depth).
Prints a table (task, metric, value, stderr, documents) and writes <out>/eval.json (default:
<workdir>/tasks_<step>, or with --hf eval/<DIR's name> in the current folder: never into the model's folder).

  lm eval --workdir=RUN | --hf=DIR --harness --tasks=arc_easy,gsm8k [--limit=N] [--include_path=TASKS_DIR]

With --harness: any task of lm-evaluation-harness (pip install lm-eval), run by the harness itself with the model as
its LM (log-likelihoods as above, generation with lm's KV cache), where the harness can read the task's data; prints
the harness's table and writes <out>/harness.json.
"""

import pathlib

from absl import app, flags, logging

from lm.cli import define_string_once, parse_flags, reject_arguments
from lm.cli.resolve import find_experiment, load_config, load_hf
from lm.errors import UserError, fail, run_user_errors

_WORKDIR = define_string_once("workdir", "A run folder written by lm train.")
_STEP = flags.DEFINE_integer("step", None, "The checkpoint's step (default: the latest).")
_OUT = define_string_once("out", "Where eval.json and the results' files go (default: <workdir>/eval_<step>; "
                                  "with --tasks <workdir>/tasks_<step>, or with --hf eval/<DIR's name>).")
_TASKS = flags.DEFINE_string("tasks", None, "Zero-shot tasks to score, comma-separated (lm/eval/tasks.py): "
                                            "hellaswag,lambada_openai,arc_easy,arc_challenge,piqa,winogrande,wikitext, "
                                            "and passkey:LENGTH (synthetic passkey retrieval, LENGTH tokens long).")
_LIMIT = flags.DEFINE_integer("limit", None, "With --tasks: the first N documents of each task (default: all; "
                                             "passkey:LENGTH makes 100).")
_HF = define_string_once("hf", "With --tasks, instead of --workdir: a Hugging Face model folder (GPT-2, Llama).")
_HF_TOKENIZER = define_string_once("hf_tokenizer", "With --hf: its tokenizer.json (default: DIR's).")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "With --tasks: sequences per scoring batch.")
_HARNESS = flags.DEFINE_bool("harness", False, "With --tasks: lm-evaluation-harness's own tasks, run by the harness "
                                               "(pip install lm-eval) with this model as its LM (lm/eval/harness.py).")
_INCLUDE_PATH = flags.DEFINE_string("include_path", None, "With --harness: a folder of more task YAMLs for the "
                                                          "harness (e.g. a task on local data files).")


def evaluate(workdir: pathlib.Path, step: int | None, out: str | None) -> dict[str, float]:
    """The run's evaluations at step, printed and written to out/eval.json; returns them."""
    from lm.train.evaluate import EVAL_FILE, evaluate_checkpoint

    if step is not None and step < 0:
        raise UserError(f"--step={step}: give a checkpoint's step, or leave it out for the latest")
    config = load_config(workdir)
    experiment = find_experiment(config.experiment)
    results, folder = evaluate_checkpoint(config, workdir, experiment.build, step, pathlib.Path(out) if out else None)
    print("results: " + " | ".join(f"{k} {v:.4g}" for k, v in results.items() if k != "step"))
    head = f"eval loss {results['eval_loss']:.4f}" if "eval_loss" in results else "evaluated"
    print(f"done: {head} at step {results['step']}; written: {folder / EVAL_FILE}")
    return results


def check_model(workdir: str | None, hf: str | None, limit: int | None, batch_size: int) -> None:
    """One model named (--workdir or --hf), and positive counts; else a UserError."""
    if (workdir is None) == (hf is None):
        raise UserError("--tasks scores one model: give --workdir=RUN (a run of lm train) or --hf=DIR (a Hugging "
                        "Face folder), not both")
    if (limit is not None and limit < 1) or batch_size < 1:
        raise UserError(f"--limit={limit}, --batch_size={batch_size}: give positive counts (no --limit: all documents)")


def load_model(workdir: str | None, hf: str | None, step: int | None, tokenizer: str | None, batch_size: int):
    """The model of the run in workdir (at step; default: its latest checkpoint) or of the Hugging Face folder hf
    (with its tokenizer.json or tokenizer), in float32: (its lm.eval Scorer, its lm.eval.harness HarnessModel, the
    folder its results go to by default, the name eval.json gives it). Programs go to JAX's persistent compilation
    cache as lm train's do (the run's train.compilation_cache_dir; for a folder, auto), so a rerun skips compiling:
    all of them, as the scoring's are many and most compile in under the second lm train's must take."""
    import jax

    from lm.eval import models
    from lm.eval.harness import HarnessModel
    from lm.eval.scoring import Scorer, gpt_apply
    from lm.train.setup import use_compilation_cache

    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    if hf is not None:
        use_compilation_cache("auto")
        experiment, params, tokenizer_found, prefix = load_hf(hf, tokenizer)
        scorer = Scorer(gpt_apply(experiment.model), params,
                        models.encoder(tokenizer_found), experiment.config.data.context_length, prefix, batch_size)
        end_of_text = models.hf_end_of_text(hf, tokenizer_found)
        folder, name = pathlib.Path("eval") / pathlib.Path(hf).expanduser().resolve().name, hf
    else:
        from lm import sharding
        from lm.hf import LANGUAGE_MODELS
        from lm.train.checkpoint import finished_steps
        from lm.train.setup import checkpoint_directory, restore_params

        run = pathlib.Path(workdir)
        config = load_config(run)
        if config.experiment not in LANGUAGE_MODELS:
            raise UserError(f"{run} holds a {config.experiment!r} run: --tasks scores language models")
        use_compilation_cache(config.train.get("compilation_cache_dir", "auto"))
        config.model.compute_dtype = "float32"  # (a bfloat16 run too: scored as a Hugging Face folder is)
        experiment = find_experiment(config.experiment).from_workdir(config, run)
        params = restore_params(config, experiment, run, step, sharding.make_mesh(config.mesh.to_dict()))
        step = step if step is not None else max(finished_steps(pathlib.Path(checkpoint_directory(config, run))))
        scorer = models.run_scorer(experiment.model, params, experiment.tokenizer, config.data.context_length,
                                   batch_size)
        tokenizer_found = getattr(experiment.tokenizer, "tokenizer", None)  # (the BPE's; None: characters)
        end_of_text = getattr(experiment.tokenizer, "end_of_text_id", None)
        folder, name = run / f"tasks_{step}", f"{run} step {step}"
    return scorer, HarnessModel(scorer, experiment.model, tokenizer_found, end_of_text), folder, name


def score_tasks(tasks: str, limit: int | None, workdir: str | None, hf: str | None, step: int | None = None,
                out: str | None = None, tokenizer: str | None = None, batch_size: int = 32) -> list:
    """The tasks scored on the run in workdir (at step) or the Hugging Face folder hf, printed as a table and
    written to out/eval.json; returns lm.eval.report's TaskResults."""
    from lm.eval import models, report
    from lm.eval.tasks import check_data, parse_tasks

    chosen = parse_tasks(tasks)
    check_model(workdir, hf, limit, batch_size)
    check_data(chosen)
    scorer, _, folder, name = load_model(workdir, hf, step, tokenizer, batch_size)
    folder = pathlib.Path(out) if out else folder
    characters = scorer.encode if isinstance(scorer.encode, models.CharacterEncoder) else None
    if characters:
        print(characters.note())
    results = report.evaluate(scorer, chosen, limit)
    print(report.table(results))
    if characters:
        print(characters.report())
    report.write(results, folder / report.EVAL_FILE, name, limit)
    scores = " | ".join(f"{result.task.name} {metric} {result.metrics[metric]:.4f}" for result in results
                        for metric in result.task.metrics)
    print(f"done: {scores}; written: {folder / report.EVAL_FILE}")
    return results


def harness_tasks(tasks: str, limit: int | None, workdir: str | None, hf: str | None, step: int | None = None,
                  out: str | None = None, tokenizer: str | None = None, batch_size: int = 32,
                  include_path: str | None = None) -> dict:
    """lm-evaluation-harness's tasks (comma-separated names) run by the harness on the run in workdir (at step) or
    the Hugging Face folder hf (lm/eval/harness.py), its table printed and its results written to
    out/harness.json; returns the harness's results. Without lm-eval installed, a UserError saying how."""
    from lm.eval import harness

    names = [name.strip() for name in tasks.split(",") if name.strip()]
    manager = harness.task_manager(names, include_path)  # before the model loads
    check_model(workdir, hf, limit, batch_size)
    scorer, model, folder, name = load_model(workdir, hf, step, tokenizer, batch_size)
    if model.tokenizer is None:
        raise UserError(f"{workdir} reads characters: --harness runs the harness's tasks through a BPE tokenizer; "
                        "score this run with lm's own tasks (--tasks without --harness), character by character")
    results = harness.evaluate(model, names, limit, manager)
    print(harness.table(results))
    path = (pathlib.Path(out) if out else folder) / harness.HARNESS_FILE
    harness.write(results, path, name, limit)
    print(f"done: {len(names)} task{'s' * (len(names) > 1)} scored by lm-evaluation-harness; written: {path}")
    return results


def main(argv: list[str]) -> None:
    reject_arguments(argv)
    logging.set_verbosity(logging.WARNING)
    if _TASKS.value is not None:
        command = harness_tasks if _HARNESS.value else score_tasks
        extra = {"include_path": _INCLUDE_PATH.value} if _HARNESS.value else {}
        run_user_errors(lambda: command(_TASKS.value, _LIMIT.value, _WORKDIR.value, _HF.value, _STEP.value,
                                        _OUT.value, _HF_TOKENIZER.value, _BATCH_SIZE.value, **extra))
    elif not (_WORKDIR.value or "").strip():
        fail("--workdir is missing or empty: pass --workdir=DIR, a run folder written by lm train (or --tasks=... "
             "with --workdir or --hf)")
    else:
        run_user_errors(lambda: evaluate(pathlib.Path(_WORKDIR.value), _STEP.value, _OUT.value))


def run() -> None:
    """The command: flags from sys.argv, then main."""
    app.run(main, flags_parser=parse_flags)
