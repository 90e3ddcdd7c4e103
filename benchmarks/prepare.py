"""Tokenising at scale: `lm prepare --source` against the `tokenizers` library's own batch encoding, on all cores.

  python benchmarks/prepare.py [--source='files:corpus/*.txt.gz'] [--workers=N] [--repeats=3]

Side by side, each timed --repeats times in turns (the best of each is reported: the machine may be shared):

  (a) `lm prepare --source=SOURCE --tokenizer=gpt2 --out=<tmp>` in a new process (GPT-2's tokenizer, --workers,
      default all cores): the wall seconds of the process (as the command: Python's start and imports, reading
      and counting the documents, loading the tokenizer, tokenising, writing the shards) and of its
      prepare_source call (all but Python's start and imports), the MB/s of the documents' UTF-8 for each, and
      the peak RSS of its processes (resource.getrusage in it: its own, and the largest of its workers');
  (b) the reference, in a new process with the documents read and GPT-2's tokenizer loaded first (untimed):
      `tokenizers.Tokenizer.encode_batch_fast` (the library's batch encoding without offsets; encode_batch is
      slower) on all cores, over the documents as they are, and over the documents cut into pieces of
      lm.data.token_shards.PIECE_CHARACTERS (bpe.split_text: the same ids); the faster is the reference.
      Its seconds, MB/s and peak RSS;

then the ratios (a) / (b) of the MB/s (goal: 0.8 or more). The default source is the shared corpus's four files
($LM_DATA_DIR/corpus/*.txt.gz, each file one document: 19.6 MB).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from absl import app, flags

from lm.data import token_shards
from lm.data.bpe import split_text
from lm.data.sources import Source

_SOURCE = flags.DEFINE_string("source", "files:corpus/*.txt.gz", "The documents (lm/data/sources.py spec).")
_WORKERS = flags.DEFINE_integer("workers", None, "lm prepare's --workers (default: all cores).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timings of each, in turns; the best is reported.")


# Run in processes of their own (a process's peak RSS counts that of the process it was started from), each
# prints {seconds, rss: its peak RSS in kB, workers_rss: its largest worker's}. What `lm prepare
# --source=SOURCE --tokenizer=gpt2 --out=OUT [--workers=N]` runs, timed from inside:
PREPARE = """
import json, resource, sys, time
from lm.cli.prepare import prepare_source
start = time.perf_counter()
prepare_source(sys.argv[1], "gpt2", None, sys.argv[2], workers=json.loads(sys.argv[3]))
print(json.dumps({"seconds": time.perf_counter() - start,
                  "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "workers_rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""
# The library's batch encoding of SOURCE's documents, or of their pieces, on all cores (read and GPT-2's
# tokenizer loaded first, untimed):
REFERENCE = """
import json, resource, sys, time
from lm.data import token_shards
from lm.data.bpe import BPETokenizer, split_text
from lm.data.sources import Source
texts = [text for _, text in Source(sys.argv[1])]
if sys.argv[2] == "pieces":
    texts = [piece for text in texts for piece in split_text(text, token_shards.PIECE_CHARACTERS)]
tokenizer = BPETokenizer.from_gpt2().tokenizer
start = time.perf_counter()
tokenizer.encode_batch_fast(texts, add_special_tokens=False)
print(json.dumps({"seconds": time.perf_counter() - start,
                  "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "workers_rss": 0}))
"""


def run(program: str, *args: str) -> dict:
    """{wall: seconds of the whole process, seconds, rss, workers_rss} of python -c program args."""
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", program, *args], check=True, capture_output=True, text=True)
    return {"wall": time.perf_counter() - start, **json.loads(result.stdout.splitlines()[-1])}


def main(argv):
    del argv
    documents = [text for _, text in Source(_SOURCE.value)]
    megabytes = sum(len(text.encode("utf-8")) for text in documents) / 1e6
    pieces = sum(len(split_text(text, token_shards.PIECE_CHARACTERS)) for text in documents)
    print(f"{_SOURCE.value}: {len(documents)} documents ({pieces} pieces), {megabytes:.1f} MB; {os.cpu_count()} "
          f"cores, load average {os.getloadavg()[0]:.2f}")
    runs = {"prepare": [], "documents": [], "pieces": []}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(_REPEATS.value):
            shutil.rmtree(f"{folder}/shards", ignore_errors=True)
            runs["prepare"].append(run(PREPARE, _SOURCE.value, f"{folder}/shards", json.dumps(_WORKERS.value)))
            for name in ("documents", "pieces"):
                runs[name].append(run(REFERENCE, _SOURCE.value, name))
    walls = [run["wall"] for run in runs["prepare"]]
    seconds = {name: [run["seconds"] for run in done] for name, done in runs.items()}
    rss = {name: max(run["rss"] for run in done) / 1e6 for name, done in runs.items()}  # kB -> GB
    print(f"(a) lm prepare --source --tokenizer=gpt2: {min(walls):.2f} s as a command, {megabytes / min(walls):.2f} "
          f"MB/s (all: {listed(walls)} s); {min(seconds['prepare']):.2f} s in prepare_source, "
          f"{megabytes / min(seconds['prepare']):.2f} MB/s (all: {listed(seconds['prepare'])} s); peak RSS "
          f"{rss['prepare']:.2f} GB, each worker's {max(run['workers_rss'] for run in runs['prepare']) / 1e6:.2f} GB")
    for name in ("documents", "pieces"):
        print(f"(b) tokenizers encode_batch_fast over the {name}: {min(seconds[name]):.2f} s, "
              f"{megabytes / min(seconds[name]):.2f} MB/s (all: {listed(seconds[name])} s); peak RSS "
              f"{rss[name]:.2f} GB")
    reference = min(min(seconds["documents"]), min(seconds["pieces"]))
    print(f"ratio of MB/s, (a) / the faster (b): {reference / min(walls):.2f} as a command, "
          f"{reference / min(seconds['prepare']):.2f} in prepare_source (goal: 0.8 or more); load average now "
          f"{os.getloadavg()[0]:.2f}")


def listed(seconds: list[float]) -> str:
    return ", ".join(f"{s:.2f}" for s in seconds)


if __name__ == "__main__":
    app.run(main)
