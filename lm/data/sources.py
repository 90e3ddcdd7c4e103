"""Documents from one source spec: local files, a prepared TFDS dataset, or a Hugging Face dataset.

  files:GLOB                       the files GLOB matches, sorted (`**` reaches into folders); a relative GLOB
                                   against the working directory, else against $LM_DATA_DIR. By extension:
                                   .txt (and .txt.gz): the file is one document; .jsonl, .jsonl.gz: a JSON
                                   object a line, the document its text_field (blank lines skipped); .parquet:
                                   the text_field column, a row group at a time
  tfds:NAME[/CONFIG][:SPLIT]       a dataset tensorflow-datasets has prepared (array_record or parquet files in
                                   $TFDS_DATA_DIR, else ~/tensorflow_datasets), read with its random-access
                                   data source (no TensorFlow); SPLIT (default train) may slice: train[:90%]
  hf:NAME_OR_DIR[:CONFIG][:SPLIT]  the Hugging Face `datasets` library (pip install -e ".[hf]"): a folder
                                   save_to_disk wrote (load_from_disk), another local folder or file (its
                                   data files: load_dataset), else a Hub dataset, streamed; SPLIT default train
  synthetic:TASK[:SPLIT]           a generated task whose answers can be checked (nothing read): records with the
                                   fields prompt, response (what SFT learns) and answer (what a reward checks;
                                   the response itself here). TASK addition: "123+45" -> "168", two operands of
                                   2 or 3 digits; reverse: "01234" -> "43210", a string of 3 to 6 digits that
                                   does not end in 0 (so no answer starts with one). Each task's problems in a
                                   fixed shuffled order (the same on every machine), split disjointly: test the
                                   first 2,000, val the next 2,000, train (the default SPLIT) the rest

A Source yields its documents as (where, text) in a fixed order (files in sorted order, records in file order;
a dataset's records by index), `where` naming the file and the record (`b.jsonl line 7`, `c.parquet row 12`,
`<tfds folder> train record 3`, `synthetic:addition train record 12`). Given several fields (a sentence pair's
two languages, say) it yields (where, the tuple of their texts) instead (a ValueField's field: what its read()
makes of the value, a conversation's messages say: lm/data/chat.py). A record that gives no document is one
UserError naming the source, the file and the record: a missing or non-string text field, invalid UTF-8, a
line that is not a JSON object, an empty file or split, a file that cannot be read (corrupt gzip or parquet:
the whole file). With skip_bad_records such records (an unreadable file counting as one) are skipped and
counted instead; the count and the first of them are printed once the source has been read. What concerns the
whole source is always an error: a spec or GLOB that names nothing, an unknown extension, a TFDS dataset that
is not prepared, a Hugging Face dataset that needs a network where there is none.

shard_documents(documents, index, count) gives process `index` of `count` its share: document i goes to
process i % count.
"""

import dataclasses
import functools
import glob
import gzip
import itertools
import json
import os
import pathlib
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import numpy as np
from absl import logging

from lm.data.files import DATA_DIR_ENV, OFFLINE_ENV
from lm.errors import UserError

T = TypeVar("T")
SPEC_FORMS = ("files:GLOB, tfds:NAME[/CONFIG][:SPLIT], hf:NAME_OR_DIR[:CONFIG][:SPLIT] or synthetic:TASK[:SPLIT] "
              "(docs/data.md)")
SKIP_HINT = "fix or remove it, or pass --config.data.skip_bad_records=True to skip such records"
HF_INSTALL = "pip install -e \".[hf]\" in the lm repository (or pip install 'datasets>=3,<6')"
HF_OFFLINE_ENVS = (OFFLINE_ENV, "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")  # any of them set: no network
TFDS_CHUNK = 1024  # records read from a TFDS data source at a time


@dataclasses.dataclass(frozen=True)
class Bad:
    """What is wrong with a record (or a whole file) that gives no document."""

    problem: str


class ValueField(str):
    """A field name whose value is not a text (a list of chat messages, say): read(value) gives what the record
    yields for it, or Bad."""

    def read(self, value: Any) -> Any:
        raise NotImplementedError


Fields = Mapping[str, str]  # {the config option that names a field: the field}, in the order their texts come
Record = tuple[str, "tuple[str, ...] | Bad"]  # (where, the texts of the record's fields or what is wrong with it)


class Source:
    """The documents of a spec (module docstring): iterate it for (where, text) pairs, in order. Opening
    checks what concerns the whole source (UserErrors); bad records are met while iterating. option names
    the spec in messages (e.g. data.source). text_field is the field of a record that holds its text (which
    messages say data.text_field sets); or several, as Fields ({"data.source_field": "de",
    "data.target_field": "en"}, say), and then each record gives the tuple of their texts, in that order."""

    def __init__(self, spec: str, text_field: "str | Fields" = "text", skip_bad_records: bool = False,
                 option: str = "source"):
        self.name, self.skip_bad_records = f"{option}={spec}", skip_bad_records
        self.one_field = isinstance(text_field, str)
        fields = {"data.text_field": text_field} if self.one_field else dict(text_field)
        kind, _, rest = spec.partition(":")
        openers = {"files": open_files, "tfds": open_tfds, "hf": open_hf, "synthetic": open_synthetic}
        if kind not in openers or not rest:
            raise UserError(f"{self.name}: use {SPEC_FORMS}")
        self._records: Callable[[], Iterator[Record]] = openers[kind](rest, fields, self.name)
        self.skipped = 0  # the bad records the last pass skipped

    def __iter__(self) -> Iterator[tuple[str, "str | tuple[str, ...]"]]:
        self.skipped, first = 0, None
        for where, texts in self._records():
            if not isinstance(texts, Bad):
                yield where, texts[0] if self.one_field else texts
            elif self.skip_bad_records:
                self.skipped += 1
                first = first or f"{where}: {texts.problem}"
            else:
                raise UserError(f"{self.name}: {where}: {texts.problem}; {SKIP_HINT}")
        if first:
            print(f"warning: skipped {self.skipped} bad records of {self.name} (the first: {first})", file=sys.stderr)


def shard_documents(documents: Iterable[T], index: int, count: int) -> Iterator[T]:
    """Process index's share of documents among count processes: document i goes to process i % count, so
    the processes read disjoint documents that together are the source, once."""
    if not 0 <= index < count:
        raise ValueError(f"process index {index} is not in [0, {count})")
    return itertools.islice(documents, index, None, count)


def field_text(record: Mapping[str, Any], field: str, option: str = "data.text_field") -> "str | Bad":
    """The text of record[field] (bytes are decoded as UTF-8), or what is wrong with it (option: the config
    option that names the field)."""
    if field not in record:
        fields = ", ".join(map(str, record)) or "none"
        return Bad(f"has no field {field!r} (its fields: {fields[:200]}): set --config.{option}")
    value = record[field]
    if isinstance(field, ValueField):
        return field.read(value)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as e:
            return Bad(f"field {field!r} is not UTF-8 text ({e.reason} at byte {e.start})")
    if not isinstance(value, str):
        return Bad(f"field {field!r} is {'null' if value is None else type(value).__name__}, not a string")
    return value


def record_texts(record: Mapping[str, Any], fields: Fields) -> "tuple[str, ...] | Bad":
    """The texts of record's fields, in order, or what is wrong with the first that gives none."""
    texts = tuple(field_text(record, field, option) for option, field in fields.items())
    return next((text for text in texts if isinstance(text, Bad)), texts)


def first_missing(fields: Fields, present: Iterable[str]) -> tuple[str, str] | None:
    """(option, field) of the first of fields that is not in present (a dataset's features), or None."""
    present = set(present)
    return next(((option, field) for option, field in fields.items() if field not in present), None)


# --- files:GLOB --------------------------------------------------------------------------------------


def matching_files(pattern: str, name: str) -> list[pathlib.Path]:
    """The files pattern matches, sorted: an absolute pattern as it is, a relative one in the working
    directory, else in $LM_DATA_DIR. A UserError naming where it looked if it matches none."""
    pattern = os.path.expanduser(pattern)
    places = [pattern]
    data_dir = os.environ.get(DATA_DIR_ENV)
    if not os.path.isabs(pattern) and data_dir:
        places.append(os.path.join(data_dir, pattern))
    for place in places:
        found = sorted(pathlib.Path(path) for path in glob.glob(place, recursive=True) if os.path.isfile(path))
        if found:
            return found
    where = " nor ".join(places) + ("" if data_dir else f" (${DATA_DIR_ENV} is not set)")
    raise UserError(f"{name}: no file matches {where}: give a glob of .txt, .jsonl, .jsonl.gz or .parquet files, "
                    f"absolute or relative to the working directory or ${DATA_DIR_ENV}")


def open_files(pattern: str, fields: Fields, name: str) -> Callable[[], Iterator[Record]]:
    readers = {".txt": read_text, ".txt.gz": read_text, ".jsonl": read_jsonl, ".jsonl.gz": read_jsonl,
               ".parquet": read_parquet}
    files = []
    for path in matching_files(pattern, name):
        suffix = next((s for s in readers if path.name.endswith(s)), None)
        if suffix is None:
            raise UserError(f"{name}: {path} is not a file lm reads: use {', '.join(readers)} files (or a glob "
                            "that leaves it out)")
        if readers[suffix] is read_text and len(fields) > 1:
            raise UserError(f"{name}: {path} is one text, not records with the fields "
                            f"{', '.join(map(repr, fields.values()))}: use .jsonl, .jsonl.gz or .parquet files")
        files.append((path, readers[suffix]))
    return lambda: (record for path, read in files for record in read(path, fields))


def read_text(path: pathlib.Path, fields: Fields) -> Iterator[Record]:
    """A .txt (or .txt.gz) file as one document (the text of its one field)."""
    del fields  # the whole file is the text
    try:
        data = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        yield str(path), Bad(f"is not UTF-8 text ({e.reason} at byte {e.start})")
    except (OSError, EOFError, zlib.error) as e:
        yield str(path), Bad(f"cannot be read ({type(e).__name__}: {e})")
    else:
        yield str(path), (text,) if text.strip() else Bad("is empty")


def read_jsonl(path: pathlib.Path, fields: Fields) -> Iterator[Record]:
    """A JSON object a line (gzipped for .jsonl.gz), the texts its fields; blank lines are skipped. A
    file that cannot be read from some line on (corrupt gzip) is bad from that line."""
    records, number = 0, 0
    try:
        with (gzip.open if path.name.endswith(".gz") else open)(path, "rb") as lines:
            for number, line in enumerate(lines, 1):
                if line.strip():
                    records += 1
                    yield f"{path} line {number}", json_texts(line, fields)
    except (OSError, EOFError, zlib.error) as e:
        yield f"{path} line {number + 1}", Bad(f"cannot be read ({type(e).__name__}: {e})")
        return
    if not records:
        yield str(path), Bad("is empty: no JSON lines")


def json_texts(line: bytes, fields: Fields) -> "tuple[str, ...] | Bad":
    try:
        record = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as e:
        return Bad(f"is not UTF-8 text ({e.reason} at byte {e.start} of the line)")
    except json.JSONDecodeError as e:
        return Bad(f"is not valid JSON ({e.msg} at column {e.colno})")
    if not isinstance(record, dict):
        names = ("a field " if len(fields) == 1 else "the fields ") + ", ".join(map(repr, fields.values()))
        return Bad(f"is a JSON {type(record).__name__}, not an object with {names}")
    return record_texts(record, fields)


def read_parquet(path: pathlib.Path, fields: Fields) -> Iterator[Record]:
    """The fields' columns of a parquet file, read a row group at a time. A file that cannot be read (or a
    row group: the rest of the file) or that lacks a column is bad as a whole."""
    import pyarrow
    import pyarrow.parquet

    unreadable = (pyarrow.ArrowException, OSError, ValueError)
    try:
        parquet = pyarrow.parquet.ParquetFile(path)
    except unreadable as e:
        yield str(path), Bad(f"cannot be read as parquet ({type(e).__name__}: {e})")
        return
    columns = parquet.schema_arrow.names
    if missing := first_missing(fields, columns):
        option, field = missing
        yield str(path), Bad(f"has no column {field!r} (its columns: {', '.join(columns)[:200]}): set "
                             f"--config.{option}")
        return
    if parquet.metadata.num_rows == 0:
        yield str(path), Bad("is empty: no rows")
        return
    row = 0
    for group in range(parquet.num_row_groups):
        try:
            records = parquet.read_row_group(group, columns=list(dict.fromkeys(fields.values()))).to_pylist()
        except unreadable as e:
            yield f"{path} row group {group}", Bad(f"cannot be read as parquet ({type(e).__name__}: {e})")
            return
        for record in records:
            yield f"{path} row {row}", record_texts(record, fields)
            row += 1


# --- tfds:NAME[/CONFIG][:SPLIT] ----------------------------------------------------------------------


def open_tfds(rest: str, fields: Fields, name: str) -> Callable[[], Iterator[Record]]:
    dataset, _, split = rest.partition(":")
    split = split or "train"
    builder = prepared_tfds(dataset, fields, name)
    source = tfds_split(builder, dataset, split, name)

    def records() -> Iterator[Record]:
        where = f"{builder.data_dir} {split}"
        if not len(source):
            yield where, Bad("is empty: no records")
        for start in range(0, len(source), TFDS_CHUNK):
            chunk = source.__getitems__(list(range(start, min(start + TFDS_CHUNK, len(source)))))
            for index, record in enumerate(chunk, start):
                yield f"{where} record {index}", record_texts(record, fields)

    return records


def tfds_data_dir() -> str:
    """Where tensorflow-datasets keeps prepared datasets: $TFDS_DATA_DIR, else ~/tensorflow_datasets."""
    return os.environ.get("TFDS_DATA_DIR") or os.path.expanduser("~/tensorflow_datasets")


def tfds_prepare_hint(dataset: str) -> str:
    return (f"prepare it once where a network is: tfds build {dataset} --data_dir={tfds_data_dir()} "
            "--file_format=array_record, or set TFDS_DATA_DIR to the folder that holds it")


def prepared_tfds(dataset: str, fields: Fields, name: str):
    """The tfds builder of dataset (NAME[/CONFIG]) prepared in $TFDS_DATA_DIR (else ~/tensorflow_datasets),
    with every one of fields among its features. A UserError naming the source (name) where tensorflow-datasets
    has no such dataset, it is not prepared there (saying how to prepare it), or it lacks a field."""
    import tensorflow_datasets as tfds

    data_dir = tfds_data_dir()
    verbosity = logging.get_verbosity()
    logging.set_verbosity(logging.ERROR)  # not its warning that a version folder lacks files: the error says so
    try:
        builder = tfds.builder(dataset, data_dir=data_dir)
        prepared = builder.is_prepared()
    except tfds.core.registered.DatasetNotFoundError:
        raise UserError(f"{name}: tensorflow-datasets has no dataset {dataset!r} (its catalogue: "
                        "https://www.tensorflow.org/datasets/catalog)") from None
    finally:
        logging.set_verbosity(verbosity)
    if not prepared:
        raise UserError(f"{name}: the TFDS dataset {dataset} is not prepared in {data_dir}: "
                        f"{tfds_prepare_hint(dataset)}")
    features = list(builder.info.features.keys())
    if missing := first_missing(fields, features):
        option, field = missing
        raise UserError(f"{name}: the TFDS dataset {dataset} has no feature {field!r} (its features: "
                        f"{', '.join(features)}): set --config.{option}")
    return builder


def tfds_split(builder, dataset: str, split: str, name: str):
    """The split (a name, or a slice: train[:90%]) of a prepared builder as its random-access data source
    (no TensorFlow). A UserError where it was prepared as TFRecord or has no such split."""
    try:
        return builder.as_data_source(split=split)
    except NotImplementedError:  # prepared as TFRecord, which has no random access
        raise UserError(f"{name}: {builder.data_dir} holds TFRecord files, which tfds.data_source cannot read: "
                        f"prepare it again with --file_format=array_record ({tfds_prepare_hint(dataset)})") from None
    except (KeyError, ValueError) as e:
        raise UserError(f"{name}: the TFDS dataset {dataset} has no split {split!r} ({e}); its splits: "
                        f"{', '.join(builder.info.splits)}") from None


# --- hf:NAME_OR_DIR[:CONFIG][:SPLIT] -----------------------------------------------------------------


def open_hf(rest: str, fields: Fields, name: str) -> Callable[[], Iterator[Record]]:
    """A saved dataset folder (load_from_disk), other local data (load_dataset of its files) or a Hub
    dataset, streamed; the library's errors become UserErrors naming the source."""
    try:
        import datasets
    except ImportError:
        raise UserError(f"{name}: reading Hugging Face datasets needs the datasets library: {HF_INSTALL}") from None
    parts = rest.split(":")
    if len(parts) > 3:
        raise UserError(f"{name}: use hf:NAME_OR_DIR[:CONFIG][:SPLIT]")
    dataset, config, split = parts + [""] * (3 - len(parts))
    split = split or "train"
    local = pathlib.Path(dataset).expanduser()
    data_dir = os.environ.get(DATA_DIR_ENV)
    if not local.exists() and not local.is_absolute() and data_dir and (pathlib.Path(data_dir) / local).exists():
        local = pathlib.Path(data_dir) / local
    try:
        if (local / "state.json").is_file() or (local / "dataset_dict.json").is_file():  # save_to_disk's
            loaded = datasets.load_from_disk(str(local))
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise UserError(f"{name}: {local} has no split {split!r}; its splits: {', '.join(loaded)}")
                loaded = loaded[split]
            where = str(local)
        elif local.exists():
            loaded, where = datasets.load_dataset(str(local), config or None, split=split), str(local)
        elif offline := next((env for env in HF_OFFLINE_ENVS if os.environ.get(env)), None):
            raise UserError(f"{name}: {dataset} is no local folder, and reading it from the Hugging Face Hub needs "
                            f"the network, which ${offline} turns off: unset it where a network is, or give a "
                            "folder that save_to_disk wrote (or of data files)")
        else:
            loaded = datasets.load_dataset(dataset, config or None, split=split, streaming=True)
            where = f"{dataset} (the Hub)"
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 (the library raises many kinds: ConnectionError, DatasetNotFoundError, ...)
        raise UserError(f"{name}: the datasets library cannot load it ({hf_reason(e)})") from None
    features = getattr(loaded, "features", None)
    if features is not None and (missing := first_missing(fields, features)):
        option, field = missing
        raise UserError(f"{name}: it has no field {field!r} (its fields: {', '.join(features)}): set "
                        f"--config.{option}")

    def records() -> Iterator[Record]:
        index = -1
        try:
            for index, record in enumerate(loaded):
                yield f"{where} {split} record {index}", record_texts(record, fields)
        except Exception as e:  # noqa: BLE001 (a stream can fail at any record: the network, a bad shard)
            raise UserError(f"{name}: the datasets library cannot read {where} {split} record {index + 1} "
                            f"({hf_reason(e)})") from None
        if index < 0:
            yield f"{where} {split}", Bad("is empty: no records")

    return records


def hf_reason(e: Exception) -> str:
    """The library's error and its cause (e.g. which row of a data file the JSON parser failed at) in a
    line; a network error says that it needs the network."""
    causes, cause = [], e
    while cause is not None and len(causes) < 2:
        causes.append(f"{type(cause).__name__}: {' '.join(str(cause).split())[:200]}")
        cause = cause.__cause__ or cause.__context__
    reason = "; ".join(causes)
    if isinstance(e, ConnectionError):
        return f"{reason}; the Hugging Face Hub cannot be reached: run where a network is, or give a local folder"
    return reason


# --- synthetic:TASK[:SPLIT] --------------------------------------------------------------------------


def addition(index: int) -> tuple[str, str]:
    """Problem index (of 990 * 990) of the sums a+b, a and b in [10, 999]: ("a+b", the sum)."""
    a, b = divmod(index, 990)
    return f"{a + 10}+{b + 10}", str(a + b + 20)


def reverse(index: int) -> tuple[str, str]:
    """Problem index of the digit strings of 3 to 6 digits that do not end in 0, the shorter first: (the
    string, the string reversed)."""
    for length in range(3, 7):
        if index < 9 * 10 ** (length - 1):
            head, last = divmod(index, 9)
            digits = f"{head:0{length - 1}d}{last + 1}"
            return digits, digits[::-1]
        index -= 9 * 10 ** (length - 1)
    raise IndexError("reverse has 999,900 problems")


SYNTHETIC_TASKS = {"addition": (addition, 990 * 990), "reverse": (reverse, 999_900)}  # (problem(index), count)
SYNTHETIC_FIELDS = ("prompt", "response", "answer")
SYNTHETIC_HELD_OUT = {"test": (0, 2000), "val": (2000, 4000)}  # [start, end) of the shuffled order; train: the rest
SYNTHETIC_SEED = 0  # numpy's RandomState, whose stream numpy keeps the same across versions


@functools.cache
def synthetic_order(task: str) -> np.ndarray:
    """The problems of task in its fixed shuffled order."""
    return np.random.RandomState(SYNTHETIC_SEED).permutation(SYNTHETIC_TASKS[task][1])


def open_synthetic(rest: str, fields: Fields, name: str) -> Callable[[], Iterator[Record]]:
    """The records of a synthetic task's split: {prompt, response, answer}, answer the response."""
    task, _, split = rest.partition(":")
    split = split or "train"
    if task not in SYNTHETIC_TASKS or split not in ("train", *SYNTHETIC_HELD_OUT):
        raise UserError(f"{name}: use synthetic:TASK[:SPLIT], TASK one of {', '.join(SYNTHETIC_TASKS)} and SPLIT "
                        f"one of train, {', '.join(SYNTHETIC_HELD_OUT)} (default train)")
    if missing := first_missing(fields, SYNTHETIC_FIELDS):
        option, field = missing
        raise UserError(f"{name}: the synthetic task has no field {field!r} (its fields: "
                        f"{', '.join(SYNTHETIC_FIELDS)}): set --config.{option}")
    problem, count = SYNTHETIC_TASKS[task]
    start, end = SYNTHETIC_HELD_OUT.get(split, (max(end for _, end in SYNTHETIC_HELD_OUT.values()), count))

    def records() -> Iterator[Record]:
        for index, chosen in enumerate(synthetic_order(task)[start:end]):
            prompt, response = problem(int(chosen))
            record = {"prompt": prompt, "response": response, "answer": response}
            yield f"synthetic:{task} {split} record {index}", record_texts(record, fields)

    return records
