"""Metric writers: a JSONL log, TensorBoard event files and, when asked, Weights & Biases."""

import errno
import json
import os
import pathlib
import sys
import time

import jax
import numpy as np
from tensorboardX.event_file_writer import EventsWriter
from tensorboardX.proto.event_pb2 import Event
from tensorboardX.summary import scalar, text

from lm.runs import METRICS_FILE, read_records, write_whole, writing

TENSORBOARD_DIR = "tensorboard"  # in the workdir: TensorBoard's event files

def format_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:,.1f} {unit}" if unit != "B" else f"{count:,.0f} B"
        count /= 1024


# what jax.Device.memory_stats() reports (GPU, TPU; a CPU reports nothing) -> the metric it is logged as
DEVICE_MEMORY_METRICS = {"bytes_in_use": "memory_in_use_bytes", "peak_bytes_in_use": "memory_peak_bytes"}


def device_memory(devices) -> dict[str, float]:
    """The device memory in use and its peak so far, the largest over devices (this process's), as metrics
    (DEVICE_MEMORY_METRICS): each one where every device's memory_stats() reports it; {} where the backend
    reports nothing (memory_stats() is None on a CPU)."""
    stats = [device.memory_stats() or {} for device in devices]
    return {metric: float(max(s[key] for s in stats)) for key, metric in DEVICE_MEMORY_METRICS.items()
            if stats and all(key in s for s in stats)}


def memory_text(metrics: dict[str, float]) -> str:
    """'memory <in use> (peak <peak>) | ' for the progress line where metrics hold device_memory's figures."""
    if not all(metric in metrics for metric in DEVICE_MEMORY_METRICS.values()):
        return ""
    return (f"memory {format_bytes(metrics['memory_in_use_bytes'])} "
            f"(peak {format_bytes(metrics['memory_peak_bytes'])}) | ")


def truncate_log(path: pathlib.Path, last_step: int) -> None:
    """Drops records after last_step (written after the checkpoint a run resumes from), a last line cut
    short by a crash, and damaged lines (skipped and counted in a warning): one history, from step 0
    to last_step, that the resumed run appends to."""
    if not path.exists():
        return
    records, damaged = read_records(path)
    if damaged:
        print(f"warning: {path}: skipped {damaged} damaged line{'s' * (damaged > 1)} (not a JSON record with "
              "a step); kept the others", file=sys.stderr)
    kept = [record for record in records if record["step"] <= last_step]
    write_whole(path, "".join(json.dumps(record) + "\n" for record in kept))  # the old log or the new, never half


def drop_logs(workdir: pathlib.Path) -> None:
    """Removes the JSONL log and the TensorBoard event files in workdir: what an earlier attempt killed
    before its first checkpoint logged, so that a run starting again at step 0 writes one history, not a
    second one after the first (a resumed run truncates the log instead: truncate_log)."""
    (workdir / METRICS_FILE).unlink(missing_ok=True)
    for events in (workdir / TENSORBOARD_DIR).glob("events.out.tfevents.*"):
        events.unlink()


def mean_metrics(metrics_list: list[dict], weights: list | None = None) -> dict[str, float]:
    """The (weighted) mean of each metric over a list of metric dicts. A metric is a scalar or an
    (n,) array (n steps' values), each value weighted with its dict's weight (default 1)."""
    host, weights = jax.device_get((metrics_list, weights))
    weights = np.ones(len(host)) if weights is None else np.asarray(weights, np.float64)

    def mean(key: str) -> float:
        values = [np.ravel(m[key]) for m in host]
        value_weights = [np.full(len(v), w) for v, w in zip(values, weights, strict=True)]
        return float(np.average(np.concatenate(values), weights=np.concatenate(value_weights)))

    return {k: mean(k) for k in host[0]}


class MetricWriter:
    """Writes scalars and texts from process 0 only; other processes' writes are dropped. Each write is
    made and flushed by the calling thread, so that one that fails (a full disk) raises there, naming
    its file (lm.runs.writing): tensorboardX's SummaryWriter writes from a thread that such an error
    ends, after which its bounded queue blocks the run for good. A metrics.jsonl removed meanwhile (with
    its workdir) is an error too: the records would go into a file that no one can read."""

    def __init__(self, workdir: pathlib.Path, wandb_project: str = "", config: dict | None = None):
        self.enabled = jax.process_index() == 0
        self.workdir = workdir
        self._tensorboard = None
        self._wandb = None
        if not self.enabled:
            return
        self._jsonl_path, self._tensorboard_dir = workdir / METRICS_FILE, workdir / TENSORBOARD_DIR
        with writing(self._jsonl_path):
            self._jsonl = self._jsonl_path.open("a")
        with writing(self._tensorboard_dir):
            self._tensorboard_dir.mkdir(exist_ok=True)
            self._tensorboard = EventsWriter(str(self._tensorboard_dir / "events"))  # events.out.tfevents.*
        if wandb_project:
            import wandb

            self._wandb = wandb.init(project=wandb_project, dir=str(workdir), config=config)

    def write_scalars(self, step: int, scalars: dict[str, float]) -> None:
        if not self.enabled:
            return
        scalars = {k: float(v) for k, v in scalars.items()}
        with writing(self._jsonl_path):
            self._jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
            self._jsonl.flush()
            if os.fstat(self._jsonl.fileno()).st_nlink == 0:
                raise FileNotFoundError(errno.ENOENT, "removed while the run was writing it", str(self._jsonl_path))
        self._write_events(step, [scalar(name, value) for name, value in scalars.items()])
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def write_texts(self, step: int, texts: dict[str, str]) -> None:
        if not self.enabled:
            return
        path = self.workdir / "samples.txt"
        with writing(path), path.open("a") as f:
            for name, sample in texts.items():
                f.write(f"--- step {step} {name} ---\n{sample}\n")
        self._write_events(step, [text(name, sample) for name, sample in texts.items()])
        if self._wandb is not None:
            self._wandb.log(texts, step=step)

    def _write_events(self, step: int, summaries: list) -> None:
        """TensorBoard events of step, one a summary (tensorboardX.summary's protos), written and flushed."""
        with writing(self._tensorboard_dir):
            for summary in summaries:
                self._tensorboard.write_event(Event(summary=summary, step=step, wall_time=time.time()))
            self._tensorboard.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        with writing(self._jsonl_path):
            self._jsonl.close()
        with writing(self._tensorboard_dir):
            self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()
