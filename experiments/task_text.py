"""A fine-tuning task's training text without its labels, as jsonl documents that masked-LM pretraining reads
(configs/bert.py with --config.data.source=files:JSONL): in-domain pretraining
(docs/bert.md#learning-curves-and-in-domain-pretraining).

  python -m experiments.task_text --task=sst2 --jsonl=runs/text/sst2.jsonl [--sentences_per_document=64]
  lm train --config=configs/bert.py:tiny --workdir=runs/bert_tiny_sst2 \
      --config.data.source=files:runs/text/sst2.jsonl --config.data.max_documents=0 --config.data.eval_documents=6

The texts of the task's training split, in file order: SST-2 its sentences (67,349), STS-B both sentences of
each pair (11,498), CoNLL-2003 each sentence's words joined by spaces (14,041), SQuAD each context once and
then every question. Each jsonl line is one document, {"text": ...}, of --sentences_per_document consecutive
texts, one a line (a document's paragraphs, as data.source reads them), so next-sentence prediction's "B
follows A" means "B comes next in the task's file" (SST-2's file is shuffled: there it carries no meaning).
64 a document make documents large enough that a few held out (data.eval_documents) give the eval batches
their pairs.
No label is written. The labelled dev and test splits are never read.
"""

import json
import pathlib

from absl import app, flags

from lm.data.tasks import TASKS, conll2003, squad, sst2, stsb
from lm.errors import UserError, run_user_errors

_TASK = flags.DEFINE_enum("task", None, list(TASKS), "The task whose training text to write.")
_JSONL = flags.DEFINE_string("jsonl", None, "The jsonl file to write (its folder is made).")
_SENTENCES = flags.DEFINE_integer("sentences_per_document", 64, "Texts per document (jsonl line).")


def task_texts(task: str) -> list[str]:
    """The texts of a task's training split, labels left out (see the module docstring)."""
    if task == "sst2":
        return sst2.load("train")[0]
    if task == "stsb":
        firsts, seconds, _ = stsb.load("train")
        return [text for pair in zip(firsts, seconds, strict=True) for text in pair]
    if task == "conll2003":
        return [" ".join(sentence.words) for sentence in conll2003.load("train")]
    if task == "squad":
        questions = squad.load("train")
        return [*dict.fromkeys(q.context for q in questions), *(q.question for q in questions)]
    raise UserError(f"--task={task}: use one of {', '.join(TASKS)}")


def write_documents(texts: list[str], out: pathlib.Path, sentences_per_document: int) -> int:
    """Writes the texts to out as jsonl documents of sentences_per_document texts each (the last may hold
    fewer); returns how many documents."""
    if sentences_per_document < 1:
        raise UserError(f"--sentences_per_document={sentences_per_document}: give 1 or more")
    texts = [" ".join(text.split()) for text in texts if text.strip()]  # one line each
    documents = ["\n".join(texts[i : i + sentences_per_document]) for i in range(0, len(texts), sentences_per_document)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps({"text": document}) + "\n" for document in documents))
    return len(documents)


def main(argv: list[str]) -> None:
    del argv

    def run() -> None:
        if not _TASK.value or not _JSONL.value:
            raise UserError("pass --task (one of " + ", ".join(TASKS) + ") and --jsonl=FILE")
        texts = task_texts(_TASK.value)
        count = write_documents(texts, pathlib.Path(_JSONL.value), _SENTENCES.value)
        print(f"wrote {len(texts):,} texts of {_TASK.value}'s training split as {count:,} documents to {_JSONL.value}; "
              f"pretrain on them with --config.data.source=files:{_JSONL.value}")

    run_user_errors(run)


if __name__ == "__main__":
    app.run(main)
