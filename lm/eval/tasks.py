"""The zero-shot tasks, each as lm-evaluation-harness defines it (its task YAML and utils, lm-eval 0.4.13), read from
$LM_DATA_DIR (docs/data-files.md gives each file's origin and format).

  hellaswag       "<activity_label>: <ctx_a> <ctx_b capitalised>" -> " <ending>" (4), all text through the harness's
                  preprocess (strip, " [title]" -> ". ", [bracketed] marks dropped, double spaces made single);
                  acc, acc_norm. HellaSwag validation.
  lambada_openai  the passage without its last space-separated word -> " <last word>"; acc (the word is the greedy
                  continuation), perplexity (exp of minus the mean log-likelihood). OpenAI's LAMBADA test.
  arc_easy, arc_challenge  "Question: <question>\\nAnswer:" -> " <choice>" (3 to 5); acc, acc_norm. ARC test.
  piqa            "Question: <goal>\\nAnswer:" -> " <sol1>" | " <sol2>"; acc, acc_norm. PIQA validation.
  winogrande      partial evaluation: "<sentence up to the blank><option>" -> " <rest of the sentence after the
                  blank, stripped>" for each of the 2 options; acc. WinoGrande (xl) dev.
  wikitext        each page's rolling log-likelihood (of the page detokenised as the harness does); word_perplexity,
                  byte_perplexity, bits_per_byte, whose word and byte counts are of the page before detokenising.
                  Pages split as EleutherAI/wikitext_document_level splits them (62 in the test split). NOT the
                  harness's data: the shared copy is WikiText-2's tokenised release (rare words are <unk>), the
                  harness reads the raw one, so these perplexities are not comparable with published ones.
  passkey:LENGTH  synthetic passkey retrieval (lm/eval/passkey.py, not a harness task): a five-digit key hidden in
                  filler LENGTH tokens long; acc (the key is the greedy continuation), acc per depth band.

The target delimiter is " " and every task is zero-shot. acc_norm divides each choice's log-likelihood by the
choice's length in characters (the harness's len() of the choice text, without the delimiter); ties go to the first
choice (numpy's argmax). Standard errors are the harness's: the sample standard deviation (n - 1) over sqrt(n) for
the means (acc, acc_norm), none for the perplexities (the harness bootstraps LAMBADA's, which is not done here, and
has none for WikiText's).
"""

import dataclasses
import difflib
import gzip
import json
import math
import re
from collections.abc import Callable

import numpy as np

from lm.data.files import find_file
from lm.errors import UserError
from lm.eval import passkey
from lm.task_metrics import mean_stderr

DELIMITER = " "  # the harness's target_delimiter
HOW = "the file docs/data-files.md describes, in $LM_DATA_DIR/{path}"


@dataclasses.dataclass(frozen=True)
class Choices:
    """A multiple-choice document: one (context, continuation) request per choice, the choice texts (their
    lengths normalise acc_norm) and the index of the right one."""

    requests: tuple[tuple[str, str], ...]
    choices: tuple[str, ...]
    gold: int


@dataclasses.dataclass(frozen=True)
class Page:
    """A WikiText page: the text scored (detokenised), and the words and UTF-8 bytes of the page as stored."""

    text: str
    words: int
    bytes: int


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    kind: str  # "multiple_choice" (Choices), "loglikelihood" ((context, continuation)), "rolling" (Page) or
    #            "passkey" (lm/eval/passkey.py's Passkey, made with the model's tokenizer: no file, no read)
    metrics: tuple[str, ...]
    path: str  # the file under $LM_DATA_DIR
    read: Callable[[list[str]], list] | None  # the file's first lines (enough for the limit) -> documents
    length: int = 0  # passkey: the documents' length in tokens


def read_lines(path: str, limit: int | None) -> list[str]:
    """The first limit non-blank lines (all: None) of $LM_DATA_DIR/path (gzipped when it ends .gz), without their
    newlines; a missing file is a UserError naming where it was looked for."""
    found = find_file(path, how=HOW.format(path=path))
    opener = gzip.open if found.suffix == ".gz" else open
    lines = []
    with opener(found, "rt", encoding="utf-8") as f:
        for line in f:
            if limit is not None and len(lines) == limit:
                break
            if line.strip():
                lines.append(line.rstrip("\n"))
    return lines


def hellaswag_text(text: str) -> str:
    """The harness's HellaSwag preprocess: stripped, " [title]" -> ". ", [bracketed] marks dropped, "  " -> " "."""
    text = text.strip().replace(" [title]", ". ")
    return re.sub(r"\[.*?\]", "", text).replace("  ", " ")


def hellaswag(lines: list[str]) -> list[Choices]:
    documents = []
    for row in map(json.loads, lines):
        query = hellaswag_text(f"{row['activity_label']}: {row['ctx_a']} {row['ctx_b'].capitalize()}")
        endings = tuple(hellaswag_text(ending) for ending in row["endings"])
        documents.append(Choices(tuple((query, DELIMITER + ending) for ending in endings), endings, int(row["label"])))
    return documents


def question_answer(question: str, choices: list[str], gold: int) -> Choices:
    """ARC's and PIQA's prompt: "Question: <question>\\nAnswer:" then " <choice>"."""
    context = f"Question: {question}\nAnswer:"
    return Choices(tuple((context, DELIMITER + choice) for choice in choices), tuple(choices), gold)


def arc(lines: list[str]) -> list[Choices]:
    return [question_answer(row["question"], row["choices"], row["gold"]) for row in map(json.loads, lines)]


def piqa(lines: list[str]) -> list[Choices]:
    """PIQA's questions, with their labels from the file beside them (line i labels line i: 0 or 1)."""
    labels = read_lines(PIQA_LABELS, len(lines))
    return [question_answer(row["goal"], [row["sol1"], row["sol2"]], int(label))
            for row, label in zip(map(json.loads, lines), labels, strict=True)]


def winogrande(lines: list[str]) -> list[Choices]:
    documents = []
    for row in map(json.loads, lines):
        blank = row["sentence"].index("_")
        contexts = tuple(row["sentence"][:blank] + option for option in (row["option1"], row["option2"]))
        continuation = DELIMITER + row["sentence"][blank + 1:].strip()
        documents.append(Choices(tuple((context, continuation) for context in contexts), contexts,
                                 {"1": 0, "2": 1}[row["answer"]]))
    return documents


def lambada(lines: list[str]) -> list[tuple[str, str]]:
    documents = []
    for row in map(json.loads, lines):
        words = row["text"].split(" ")
        documents.append((" ".join(words[:-1]), DELIMITER + words[-1]))
    return documents


WIKITEXT_REPLACEMENTS = (  # (old, new), in order: the harness's wikitext_detokenizer
    ("s '", "s'"), ("/' [0-9]/", "/'[0-9]/"), (" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."), (" : ", ": "),
    (" ; ", "; "), (" . ", ". "), (" ! ", "! "), (" ? ", "? "), (" , ", ", "),
    (re.compile(r"\(\s*([^\)]*?)\s*\)"), r"(\1)"), (re.compile(r"\[\s*([^\]]*?)\s*\]"), r"[\1]"),
    (re.compile(r"{\s*([^}]*?)\s*}"), r"{\1}"), (re.compile(r"\"\s*([^\"]*?)\s*\""), r'"\1"'),
    (re.compile(r"'\s*([^']*?)\s*'"), r"'\1'"), ("= = = =", "===="), ("= = =", "==="), ("= =", "=="),
    (" \N{DEGREE SIGN} ", "\N{DEGREE SIGN}"), (" \n", "\n"), ("\n ", "\n"), (" N ", " 1 "), (" 's", "'s"),
)


def detokenize_wikitext(text: str) -> str:
    """WikiText's tokenised spacing undone as the harness's wikitext task does it. (Its second rule is a regex
    pattern the harness passes to str.replace, so it replaces that literal text: kept so.)"""
    for old, new in WIKITEXT_REPLACEMENTS:
        text = old.sub(new, text) if isinstance(old, re.Pattern) else text.replace(old, new)
    return text


def wikitext_pages(lines: list[str]) -> list[str]:
    """The pages of WikiText lines: a page starts at each line in title form (" = Title = "; section headings,
    " = = Section = = ", do not count), as EleutherAI/wikitext_document_level's builder splits them."""
    pages, page = [], []
    for line in lines:
        heading = line.replace("= = =", "===").replace("= =", "==").strip()
        if heading.startswith("= ") and heading.endswith(" ="):
            if "\n".join(page).strip():
                pages.append("\n".join(page))
            page = []
        page.append(line)
    return [*pages, "\n".join(page)]


def wikitext(lines: list[str]) -> list[Page]:
    return [Page(detokenize_wikitext(page), len(re.split(r"\s+", page)), len(page.encode("utf-8")))
            for page in wikitext_pages(lines)]


MULTIPLE_CHOICE = ("acc", "acc_norm")
PIQA_LABELS = "piqa/valid-labels.lst"
TASKS = {task.name: task for task in (
    Task("hellaswag", "multiple_choice", MULTIPLE_CHOICE, "hellaswag/hellaswag_val.jsonl.gz", hellaswag),
    Task("lambada_openai", "loglikelihood", ("perplexity", "acc"), "lambada/lambada_test.jsonl", lambada),
    Task("arc_easy", "multiple_choice", MULTIPLE_CHOICE, "arc/arc_easy_test.jsonl", arc),
    Task("arc_challenge", "multiple_choice", MULTIPLE_CHOICE, "arc/arc_challenge_test.jsonl", arc),
    Task("piqa", "multiple_choice", MULTIPLE_CHOICE, "piqa/valid.jsonl", piqa),
    Task("winogrande", "multiple_choice", ("acc",), "winogrande/winogrande_dev.jsonl", winogrande),
    Task("wikitext", "rolling", ("word_perplexity", "byte_perplexity", "bits_per_byte"),
         "corpus/wikitext2_test.txt.gz", wikitext),
)}


# the harness's groups whose name a user may give for one of lm's tasks: {group: (lm's task, what the group is)}
GROUPS = {"lambada": ("lambada_openai", "the harness's lambada is a group of lambada_openai and lambada_standard; "
                                        "lm scores lambada_openai")}


def unknown_task(name: str) -> str:
    """'helaswag' (did you mean hellaswag?): an unknown name with the task it most likely means, if any."""
    if name in GROUPS:
        task, group = GROUPS[name]
        return f"{name!r} (did you mean {task}? {group})"
    close = difflib.get_close_matches(name, TASKS, n=1)
    return f"{name!r}{f' (did you mean {close[0]}?)' if close else ''}"


def passkey_task(name: str) -> Task:
    """passkey:LENGTH (lm/eval/passkey.py) as a Task; a malformed LENGTH is a UserError."""
    return Task(name, "passkey", passkey.METRICS, "", None, passkey.parse_length(name))


def parse_tasks(text: str) -> list[Task]:
    """'hellaswag,piqa,passkey:512' -> those tasks, in order; an unknown name is a UserError suggesting the task it
    most likely means (lambada: lambada_openai) and listing the known ones."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [unknown_task(name) for name in names if name not in TASKS and not name.startswith(passkey.PREFIX)]
    if unknown or not names:
        raise UserError(f"--tasks={text}: unknown task {', '.join(unknown) or '(none given)'}; the tasks are "
                        f"{', '.join(TASKS)}, and passkey:LENGTH")
    return [passkey_task(name) if name.startswith(passkey.PREFIX) else TASKS[name] for name in dict.fromkeys(names)]


def check_data(tasks: list[Task]) -> None:
    """Every file the tasks read is in $LM_DATA_DIR (else the UserError naming it), before a model is loaded."""
    for task in tasks:
        if task.kind == "passkey":  # synthetic: no file
            continue
        for path in (task.path, *([PIQA_LABELS] if task.name == "piqa" else [])):
            find_file(path, how=HOW.format(path=path))


def documents(task: Task, limit: int | None = None) -> list:
    """The task's first limit documents (all: None), read from $LM_DATA_DIR."""
    if task.kind == "rolling":  # pages span many lines: all are read, then the pages cut
        return task.read(read_whole(task.path))[:limit]
    return task.read(read_lines(task.path, limit))


def read_whole(path: str) -> list[str]:
    """Every line of $LM_DATA_DIR/path, as str.split("\\n") gives them (blank ones and the last empty one kept)."""
    found = find_file(path, how=HOW.format(path=path))
    opener = gzip.open if found.suffix == ".gz" else open
    with opener(found, "rt", encoding="utf-8") as f:
        return f.read().split("\n")


def multiple_choice_scores(document: Choices, loglikelihoods: list[float]) -> dict[str, float]:
    """acc and acc_norm of one document from its choices' log-likelihoods (first maximum wins)."""
    values = np.asarray(loglikelihoods, np.float64)
    lengths = np.asarray([len(choice) for choice in document.choices], np.float64)
    return {"acc": float(np.argmax(values) == document.gold),
            "acc_norm": float(np.argmax(values / lengths) == document.gold)}


def aggregate(task: Task, documents: list, responses: list) -> dict[str, float | None]:
    """The task's metrics and their standard errors ('<metric>_stderr', None where there is none) from each
    document's responses: [(log-likelihood, is_greedy)] per request, or a page's log-likelihood."""
    results: dict[str, float | None] = {}
    if task.kind == "passkey":
        return passkey.aggregate(documents, responses)
    if task.kind == "multiple_choice":
        scores = [multiple_choice_scores(document, [ll for ll, _ in response])
                  for document, response in zip(documents, responses, strict=True)]
        for metric in task.metrics:
            values = [score[metric] for score in scores]
            results.update({metric: float(np.mean(values)), f"{metric}_stderr": mean_stderr(values)})
    elif task.kind == "loglikelihood":
        loglikelihoods = [response[0][0] for response in responses]
        greedy = [float(response[0][1]) for response in responses]
        results.update({"perplexity": math.exp(-float(np.mean(loglikelihoods))), "perplexity_stderr": None,
                        "acc": float(np.mean(greedy)), "acc_stderr": mean_stderr(greedy)})
    else:
        total = sum(responses)
        words = sum(page.words for page in documents)
        size = sum(page.bytes for page in documents)
        results.update({"word_perplexity": math.exp(-total / words), "word_perplexity_stderr": None,
                        "byte_perplexity": math.exp(-total / size), "byte_perplexity_stderr": None,
                        "bits_per_byte": -total / size / math.log(2), "bits_per_byte_stderr": None})
    return results
