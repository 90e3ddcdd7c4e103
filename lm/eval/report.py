"""One model on several tasks: each task's documents scored (lm/eval/scoring.py), its metrics (lm/eval/tasks.py),
the table `lm eval --tasks` prints and the eval.json it writes."""

import dataclasses
import pathlib
import time

from lm import runs
from lm.errors import UserError
from lm.eval import passkey
from lm.eval.scoring import Scorer, loglikelihoods, rolling_loglikelihoods
from lm.eval.tasks import Task, aggregate, documents

EVAL_FILE = "eval.json"
WIKITEXT_NOTE = "wikitext: WikiText-2's tokenised release (<unk> for rare words), not the raw text the harness reads"
LAMBADA_NOTE = ("lambada_openai: perplexity of the passages' last words (exp of minus their mean log-likelihood); acc: "
                "the share of passages whose last word is the model's greedy continuation")
# the notes the table ends with, for the tasks whose metrics need saying what they are
NOTES = {"lambada_openai": LAMBADA_NOTE, "wikitext": WIKITEXT_NOTE}


@dataclasses.dataclass
class TaskResult:
    task: Task
    documents: int
    metrics: dict[str, float | None]  # '<metric>' and '<metric>_stderr' (None: no standard error)
    responses: list  # per document: [(log-likelihood, is_greedy)] per request, or a page's log-likelihood
    seconds: float


def responses(scorer: Scorer, task: Task, task_documents: list) -> list:
    """Each document's responses: the (log-likelihood, is_greedy) of its requests (one per choice, or LAMBADA's
    one), all the task's requests scored together; a WikiText page's rolling log-likelihood."""
    if task.kind == "rolling":
        return rolling_loglikelihoods(scorer, [page.text for page in task_documents], task.name)
    requests = [document.requests if task.kind == "multiple_choice" else
                (document.request,) if task.kind == "passkey" else (document,) for document in task_documents]
    flat = iter(loglikelihoods(scorer, [request for document in requests for request in document], task.name))
    return [[next(flat) for _ in document] for document in requests]


def task_inputs(scorer: Scorer, task: Task, limit: int | None) -> list:
    """The task's first limit documents (all: None), read from $LM_DATA_DIR; passkey's made with the scorer's
    tokenizer (limit of them, default passkey.DEFAULT_DOCUMENTS), once its length is one the model reads."""
    if task.kind == "passkey":
        passkey.check_length(task.length, scorer.max_length)
        return passkey.documents(scorer.encode, task.length, limit)
    return documents(task, limit)


def evaluate(scorer: Scorer, tasks: list[Task], limit: int | None = None) -> list[TaskResult]:
    """Each task's first limit documents (all: None) scored."""
    results = []
    for task in tasks:
        start = time.perf_counter()
        try:
            task_documents = task_inputs(scorer, task, limit)
            found = responses(scorer, task, task_documents)
        except UserError as error:  # e.g. a continuation longer than the model reads
            raise UserError(f"{task.name}: {error}") from None
        results.append(TaskResult(task, len(task_documents), aggregate(task, task_documents, found), found,
                                  time.perf_counter() - start))
    return results


def table(results: list[TaskResult]) -> str:
    """task | metric | value | stderr | documents, one row per metric ('-' where there is no value or no standard
    error), then a line for each task whose metrics need saying what they are (NOTES)."""
    rows = [("task", "metric", "value", "stderr", "n")]
    for result in results:
        for metric in result.task.metrics:
            stderr, value = result.metrics[f"{metric}_stderr"], result.metrics[metric]
            rows.append((result.task.name, metric, "-" if value is None else f"{value:.4f}",
                         "-" if stderr is None else f"{stderr:.4f}", str(result.documents)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [" | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "-|-".join("-" * width for width in widths))
    lines += [NOTES[result.task.name] for result in results if result.task.name in NOTES]
    return "\n".join(lines)


def write(results: list[TaskResult], path: pathlib.Path, model: str, limit: int | None) -> None:
    """eval.json: the model, the limit, and per task its metrics, documents and seconds; written whole or not
    at all (an interrupted write leaves the previous file)."""
    found = {"model": model, "limit": limit,
             "tasks": {result.task.name: {**result.metrics, "documents": result.documents,
                                          "seconds": round(result.seconds, 3)} for result in results}}
    path.parent.mkdir(parents=True, exist_ok=True)
    runs.write_json(path, found)
