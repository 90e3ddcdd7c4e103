"""lm-evaluation-harness itself, with lm as its model: any harness task runs on an lm run or a Hugging Face folder
(`lm eval --harness --tasks=...`, docs/evaluation.md) where the harness can read the task's data.

  HarnessModel      the harness's LM interface (lm_eval.api.model.LM) on lm's Scorer and GPT, without lm_eval:
                    loglikelihood and loglikelihood_rolling are lm/eval/scoring.py's (equal to the harness's
                    Hugging Face model), generate_until decodes with lm's KV cache (lm/decode/generate.py)
  as_harness_lm     a HarnessModel as an instance of the harness's LM class (lm_eval imported there)
  task_manager      the harness's tasks, the names checked
  evaluate          lm_eval.simple_evaluate of some tasks with it; table, write: its table and harness.json

lm-eval is an optional dependency (pip install lm-eval): nothing else in lm imports it, and its absence is one
UserError saying how to install it.

generate_until, for each request (context, generation options), as the harness's Hugging Face model generates: the
options' `until` (a string or a list) plus the tokenizer's end-of-text text are the stop strings; at most
max_gen_toks new tokens (or its aliases max_new_tokens, max_tokens, max_completion_tokens; default 256); greedy
unless do_sample (then softmax sampling at the options' temperature, top_k (default: all) and top_p). The context is
encoded as the scorer encodes text and cut from the left to the model's context minus the new tokens. The new tokens
stop at the first end-of-text id, are decoded without special tokens and cut before the first stop string. One
request at a time; the decoded length is rounded up to one of the scorer's bucket lengths (the extra tokens are
dropped), so decoding compiles at most that many programs.
"""

import dataclasses
import importlib
import json
import pathlib
from collections.abc import Sequence

import jax
import numpy as np
import tokenizers

from lm.decode.generate import generate
from lm.errors import UserError
from lm.eval.scoring import Scorer, bucket_lengths, loglikelihoods, rolling_loglikelihoods
from lm.models.gpt import GPT

DEFAULT_MAX_GEN_TOKS = 256  # the harness's new tokens when a task names none (its Hugging Face model's)
MAX_TOKEN_OPTIONS = ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")  # the harness's order
HARNESS_FILE = "harness.json"
INSTALL = ("--harness runs lm-evaluation-harness, which is not installed here: pip install lm-eval (an optional "
           "dependency; lm eval --tasks without --harness needs none)")


@dataclasses.dataclass(frozen=True)
class Generation:
    """What a generate_until request asks for (its options, as the harness normalises them)."""

    until: tuple[str, ...]  # stop strings
    max_new_tokens: int
    temperature: float  # 0: greedy
    top_k: int  # 0: all
    top_p: float  # 1: all


def generation_options(options: dict, end_of_text: str | None) -> Generation:
    """The Generation of a request's options: until (str or list) and end_of_text as stop strings, the first of
    MAX_TOKEN_OPTIONS given (default DEFAULT_MAX_GEN_TOKS), greedy unless do_sample (or, with do_sample unset, a
    temperature above 0)."""
    until = options.get("until") or []
    until = [until] if isinstance(until, str) else list(until)
    if end_of_text and end_of_text not in until:
        until.append(end_of_text)
    max_new_tokens = next((int(options[key]) for key in MAX_TOKEN_OPTIONS if options.get(key) is not None),
                          DEFAULT_MAX_GEN_TOKS)
    temperature = float(options.get("temperature") or 0.0)
    sampled = options.get("do_sample")
    if not (sampled if sampled is not None else temperature > 0):
        temperature = 0.0
    return Generation(tuple(until), max_new_tokens, temperature, int(options.get("top_k") or 0),
                      float(options.get("top_p") or 1.0))


def cut_at_stops(text: str, stops: Sequence[str]) -> str:
    """text before the first occurrence of any non-empty stop string."""
    for stop in stops:
        if stop:
            text = text.split(stop)[0]
    return text


class HarnessModel:
    """lm's GPT behind the harness's LM interface. A request is anything with the harness's `.args` tuple:
    (context, continuation) for loglikelihood, (text,) for loglikelihood_rolling, (context, options) for
    generate_until."""

    def __init__(self, scorer: Scorer, model: GPT, tokenizer: tokenizers.Tokenizer, end_of_text_id: int | None,
                 seed: int = 0):
        """scorer: the model's Scorer (its params, encode and context); model: the same GPT, for decoding;
        tokenizer: to decode generated ids; end_of_text_id: where generation stops (None: only at a stop string);
        seed: of sampled generations."""
        super().__init__()  # (the harness's LM.__init__, in as_harness_lm's class)
        self.scorer, self.model, self.tokenizer = scorer, model, tokenizer
        self.end_of_text_id, self.seed = end_of_text_id, seed

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """(log-likelihood, is_greedy) of each (context, continuation)."""
        return loglikelihoods(self.scorer, [request.args for request in requests])

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """The rolling log-likelihood of each (text,)."""
        return rolling_loglikelihoods(self.scorer, [request.args[0] for request in requests])

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """The generated text of each (context, options)."""
        return [self.generate(context, options, index) for index, (context, options)
                in enumerate(request.args for request in requests)]

    def generate(self, context: str, options: dict, index: int = 0) -> str:
        """context's continuation as the options ask (see the module docstring); index: the request's, for the
        sampling key."""
        end_of_text = None if self.end_of_text_id is None else self.tokenizer.decode([self.end_of_text_id],
                                                                                    skip_special_tokens=False)
        wanted = generation_options(options, end_of_text)
        room = self.scorer.max_length - wanted.max_new_tokens
        if room < 1:
            raise UserError(f"a task asks for {wanted.max_new_tokens} new tokens, and the model reads "
                            f"{self.scorer.max_length}: it leaves no room for the context")
        ids = self.scorer.encode(context)[-room:]
        if not ids:
            if self.scorer.prefix_token_id is None:
                raise UserError("an empty context needs a prefix token, and this tokenizer has no BOS or EOS token")
            ids = [self.scorer.prefix_token_id]
        length = next(b for b in bucket_lengths(self.scorer.max_length, self.scorer.num_buckets)
                      if b >= len(ids) + wanted.max_new_tokens)
        rng = jax.random.fold_in(jax.random.key(self.seed), index)
        found = generate(self.model, self.scorer.params, np.asarray([ids], np.int32), length - len(ids), rng,
                         wanted.temperature, wanted.top_k, wanted.top_p)
        new = [int(i) for i in found[0, len(ids):len(ids) + wanted.max_new_tokens]]
        if self.end_of_text_id in new:
            new = new[:new.index(self.end_of_text_id)]
        return cut_at_stops(self.tokenizer.decode(new, skip_special_tokens=True), wanted.until)


def import_harness():
    """The lm_eval module; a UserError saying how to install it where it is missing."""
    try:
        return importlib.import_module("lm_eval")
    except ModuleNotFoundError as e:
        if e.name != "lm_eval":
            raise
        raise UserError(INSTALL) from None


def as_harness_lm(model: HarnessModel):
    """model's state in an instance of a subclass of both HarnessModel and the harness's LM."""
    import_harness()
    base = importlib.import_module("lm_eval.api.model").LM
    harness_class = type("LMHarnessModel", (HarnessModel, base), {})
    return harness_class(model.scorer, model.model, model.tokenizer, model.end_of_text_id, model.seed)


def task_manager(tasks: list[str], include_path: str | None = None):
    """The harness's TaskManager (with the task YAMLs under include_path), once every name of tasks is one it
    knows (a task, group or tag) or a YAML file; else a UserError."""
    import_harness()
    manager = importlib.import_module("lm_eval.tasks").TaskManager(include_path=include_path)
    unknown = [name for name in tasks if name not in manager.task_index and not pathlib.Path(name).is_file()]
    if unknown or not tasks:
        raise UserError(f"--tasks: lm-evaluation-harness has no task {', '.join(map(repr, unknown)) or '(none given)'}"
                        " (`lm-eval ls tasks` lists them; --include_path=DIR adds task YAMLs of your own)")
    return manager


def evaluate(model: HarnessModel, tasks: list[str], limit: int | None, manager) -> dict:
    """lm_eval.simple_evaluate of the harness tasks named (manager: their task_manager) on their first limit
    documents (all: None), with model: the harness's results dict. Data it cannot reach is a UserError."""
    try:
        return import_harness().simple_evaluate(model=as_harness_lm(model), tasks=tasks, limit=limit,
                                                log_samples=False, task_manager=manager)
    except ConnectionError as e:  # the datasets library, offline or unreachable
        raise UserError(f"the harness cannot read a task's data ({e}): give it network access or a cached copy "
                        "(HF_DATASETS_CACHE), or a task YAML on local files with --include_path=DIR") from e


def table(results: dict) -> str:
    """The harness's own table of its results."""
    return importlib.import_module("lm_eval.utils").make_table(results)


def write(results: dict, path: pathlib.Path, model: str, limit: int | None) -> None:
    """harness.json: the model, the limit, the harness's version and, per task, its metrics (results["results"]),
    versions and document counts."""
    found = {"model": model, "limit": limit, "lm_eval": import_harness().__version__,
             **{key: results.get(key) for key in ("results", "versions", "n-samples")}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(found, indent=2, default=str) + "\n")
