"""Zero-shot tasks scored during training (eval.benchmarks), as llm.c logs HellaSwag while GPT-2 trains.

eval.benchmarks is a string of task:N, comma-separated ("hellaswag:500,arc_easy:200"): each task of
lm/eval/tasks.py on its first N documents. Each is one Evaluator of the trainer (lm/train/experiment.py), run with
the eval loss every eval.every steps, and logs its metrics as <task>_<metric> (hellaswag_acc, hellaswag_acc_norm;
lambada_openai_perplexity, ...), the numbers `lm eval --tasks=<task> --limit=N` gives for the same params. The
documents are read once, when the evaluators are made; every evaluation scores them with one Scorer's programs
(lm/eval/scoring.py: compiled at the first evaluation, reused after), on the params the trainer hands its
evaluators (on one process: sharded as in training, and the batches are split over the mesh's batch axes).
"""

import dataclasses
from collections.abc import Callable

from lm.errors import UserError
from lm.eval import report
from lm.eval.scoring import Scorer
from lm.eval.tasks import TASKS, Task, aggregate, documents
from lm.train.experiment import Evaluator

FORM = "task:N, comma-separated, e.g. hellaswag:500,arc_easy:200 (a task's first N documents)"


def parse_benchmarks(spec: str) -> list[tuple[Task, int]]:
    """'hellaswag:500,arc_easy:200' -> [(hellaswag, 500), (arc_easy, 200)]; '' -> []. A malformed entry, an unknown
    task (the error lists the known ones), a count below 1 or a task named twice is a UserError."""
    chosen: dict[str, tuple[Task, int]] = {}
    for entry in filter(None, (part.strip() for part in spec.split(","))):
        name, _, count = (piece.strip() for piece in entry.partition(":"))
        if name not in TASKS:
            raise UserError(f"eval.benchmarks={spec}: unknown task {name!r}; the tasks are {', '.join(TASKS)}")
        if not count.isdigit() or int(count) < 1 or name in chosen:
            raise UserError(f"eval.benchmarks={spec}: {entry!r} is not task:N with N >= 1 (each task once); "
                            f"write {FORM}")
        chosen[name] = (TASKS[name], int(count))
    return list(chosen.values())


def benchmark_evaluators(spec: str, every: int, scorer: Scorer) -> list[Evaluator]:
    """One Evaluator per task of spec (parse_benchmarks), every `every` steps: its documents read now, scored by
    scorer (its params replaced by the ones each evaluation gets), its metrics without their standard errors."""
    evaluators = []
    for task, limit in parse_benchmarks(spec):
        evaluators.append(Evaluator(task.name, every, task_metrics(scorer, task, documents(task, limit))))
    return evaluators


def task_metrics(scorer: Scorer, task: Task, task_documents: list) -> Callable[[object], dict[str, float]]:
    """params -> the task's metrics on task_documents ({"acc": ..., "acc_norm": ...})."""

    def evaluate(params) -> dict[str, float]:
        found = report.responses(dataclasses.replace(scorer, params=params), task, task_documents)
        metrics = aggregate(task, task_documents, found)
        return {metric: metrics[metric] for metric in task.metrics}

    return evaluate
