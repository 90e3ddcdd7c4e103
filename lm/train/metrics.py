"""Metric writers: a JSONL log, TensorBoard event files and, when asked, Weights & Biases."""

import json
import pathlib
import sys

import jax
import numpy as np

from lm.runs import METRICS_FILE, read_records

TENSORBOARD_DIR = "tensorboard"  # in the workdir: TensorBoard's event files

def format_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:,.1f} {unit}" if unit != "B" else f"{count:,.0f} B"
        count /= 1024


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
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(record) + "\n" for record in kept))
    tmp.replace(path)  # a crash now leaves the old log or the new one, never half of one


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
    """Writes scalars and texts from process 0 only; other processes' writes are dropped."""

    def __init__(self, workdir: pathlib.Path, wandb_project: str = "", config: dict | None = None):
        self.enabled = jax.process_index() == 0
        self.workdir = workdir
        self._tensorboard = None
        self._wandb = None
        if not self.enabled:
            return
        from tensorboardX import SummaryWriter

        self._jsonl = (workdir / METRICS_FILE).open("a")
        self._tensorboard = SummaryWriter(str(workdir / TENSORBOARD_DIR))
        if wandb_project:
            import wandb

            self._wandb = wandb.init(project=wandb_project, dir=str(workdir), config=config)

    def write_scalars(self, step: int, scalars: dict[str, float]) -> None:
        if not self.enabled:
            return
        scalars = {k: float(v) for k, v in scalars.items()}
        self._jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
        self._jsonl.flush()
        for name, value in scalars.items():
            self._tensorboard.add_scalar(name, value, step)
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def write_texts(self, step: int, texts: dict[str, str]) -> None:
        if not self.enabled:
            return
        with (self.workdir / "samples.txt").open("a") as f:
            for name, text in texts.items():
                f.write(f"--- step {step} {name} ---\n{text}\n")
                self._tensorboard.add_text(name, text, step)
        if self._wandb is not None:
            self._wandb.log(texts, step=step)

    def close(self) -> None:
        if not self.enabled:
            return
        self._jsonl.close()
        self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()
