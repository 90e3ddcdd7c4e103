r"""Run a grid of training runs (a sweep): every combination of the --sweep axes, one `lm train` run each.

  lm sweep --config=configs/gpt_shakespeare.py:baby --sweep=model.norm_position=pre,post \
      --sweep=seed=0,1,2 --workdir=runs/norm [--parallel=1] [--config.train.num_steps=500 ...]
  lm sweep --sweep_file=experiments/studies/norm_position/norm_position.py --workdir=runs/norm

Each arm trains in <workdir>/<arm name> (e.g. runs/norm/model.norm_position=pre,seed=0) through its own
`lm train` process, --parallel at a time; a crashed arm does not stop the others (its output is
in <arm>/train.log). --config.key=value overrides apply to every arm. A sweep file is a Python module
with CONFIG (the config spec), AXES ({key: [values]}) and optionally OVERRIDES ({key: value}).

A model-size axis: --sweep=size=WIDTHxDEPTH,... (e.g. size=64x2,128x4,256x4) or named sizes (NAMED_SIZES:
gpt2, gpt2-medium, pythia-70m, ...; their shapes, not their vocabularies). Each sets model.embed_dim and
model.num_layers; WIDTHxDEPTH keeps the config's head dimension (model.embed_dim / model.num_heads) and
derives model.num_heads, a named size sets its own; model.num_kv_heads keeps the config's ratio of query to
key/value heads, an explicit model.mlp_hidden_dim scales with the width, and under μP WIDTHxDEPTH sets
model.mup_base_head_dim to the head dimension (unless the config sets it). Fit the sizes' losses with lm scaling.

Every arm's overrides are checked against the config before any arm starts. Rerunning the same command
skips finished arms (results.json at train.num_steps) and resumes interrupted ones from their latest
checkpoint. <workdir>/sweep.json records the config, axes, overrides and each arm's workdir and status;
lm train writes each arm's resolved config to <arm>/config.json. Compare the arms with lm compare.

It prints each arm's start and end (`start arm 3 of 6: seed=2`) and, while arms train, every 30 s that
one of them logged, a progress line: each running arm's latest step and loss (from its metrics.jsonl)
and the time left for the whole sweep. Its last line says how the arms ended, which one has the lowest final
eval loss and how to compare them.

On a SLURM cluster, --launcher=slurm submits the arms that have not finished as one job array (through submitit,
pip install -e ".[slurm]") and returns: each arm is an element with the --slurm_* resources (one process on one
node), running the same lm train command in its folder. An element saves a checkpoint and is requeued at its
time limit or when preempted, and resumes. sweep.json records each arm's job id. The same command with --status
prints each arm's job state (sacct) and progress (its folder), for either launcher; rerunning the command
resubmits the arms whose jobs ended before they finished (not those still pending or running).

  lm sweep --config=configs/gpt_shakespeare.py:small --sweep=seed=0,1,2 --workdir=/shared/runs/seeds \
      --launcher=slurm --slurm_partition=gpu --slurm_time=240 --slurm_gpus_per_node=1 [--status]
"""

import collections
import concurrent.futures
import dataclasses
import importlib.util
import itertools
import json
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

from absl import app, flags

from lm.cli import define_string_once, define_workdir, parse_flags, reject_arguments
from lm.cli.overrides import format_value, parse_axis, parse_value, resolve_config, split_config_overrides
from lm.errors import UserError, run_user_errors
from lm.progress import format_duration, shown_path
from lm.runs import METRICS_FILE, RESULTS_FILE, SUMMARY_FILE, SWEEP_FILE
from lm.scaling import NAMED_SIZES, SIZE_AXIS, SIZE_KEYS

LOG_FILE = "train.log"  # an arm's lm train output
PROGRESS_SECONDS = 30.0  # a progress line at most this often while arms run
STOPPED_EXIT_CODES = (128 + signal.SIGTERM, 128 + signal.SIGINT)  # lm train saved a checkpoint, then stopped

_CONFIG = define_string_once("config", "Config file and variant, e.g. configs/gpt_shakespeare.py:baby")
_SWEEP = flags.DEFINE_multi_string("sweep", [], "An axis: key=value1,value2,... (repeat for a grid).")
_SWEEP_FILE = flags.DEFINE_string("sweep_file", None, "A Python file with CONFIG, AXES and OVERRIDES.")
_WORKDIR = define_workdir("The sweep folder; each arm trains in a subfolder.")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "How many arms train at a time.")
_LAUNCHER = flags.DEFINE_enum("launcher", "local", ["local", "slurm"],
                              "local: each arm an lm train process on this machine, --parallel at a time; slurm: "
                              "the arms submitted as one SLURM job array (submitit), then lm sweep returns.")
_STATUS = flags.DEFINE_boolean("status", False, "Launch nothing: print each arm's job state and progress.")
_SLURM_PARTITION = flags.DEFINE_string("slurm_partition", None, "SLURM partition of the arms' jobs.")
_SLURM_TIME = flags.DEFINE_integer("slurm_time", 240, "Each arm's time limit in minutes; at it the arm saves a "
                                   "checkpoint and is requeued.")
_SLURM_GPUS = flags.DEFINE_integer("slurm_gpus_per_node", 1, "GPUs of each arm (one process on one node).")
_SLURM_CPUS = flags.DEFINE_integer("slurm_cpus_per_task", None, "CPU cores of each arm (default: SLURM's).")
_SLURM_MEM = flags.DEFINE_float("slurm_mem_gb", None, "Memory of each arm in GB (default: SLURM's).")
_SLURM_ACCOUNT = flags.DEFINE_string("slurm_account", None, "SLURM account the jobs are charged to.")
_SLURM_QOS = flags.DEFINE_string("slurm_qos", None, "SLURM quality of service of the jobs.")
_SLURM_ARRAY_PARALLELISM = flags.DEFINE_integer("slurm_array_parallelism", None,
                                                "How many arms run at a time (default: all).")
_SLURM_FOLDER = flags.DEFINE_string("slurm_folder", None, "submitit's job files and logs (default <workdir>/slurm).")
SLURM_FLAGS = ("slurm_partition", "slurm_time", "slurm_gpus_per_node", "slurm_cpus_per_task", "slurm_mem_gb",
               "slurm_account", "slurm_qos", "slurm_array_parallelism", "slurm_folder")


@dataclasses.dataclass
class Arm:
    name: str
    overrides: dict[str, str]  # the axis values of this arm, as command-line strings
    workdir: pathlib.Path
    num_steps: int  # train.num_steps of the arm's resolved config
    status: str = "pending"  # pending | running | finished | skipped (finished earlier) | interrupted | failed (exit N)
    started: float | None = None  # time.monotonic() when it started running
    seconds: float | None = None  # how long it ran, once it stopped
    train_flags: dict[str, str] = dataclasses.field(default_factory=dict)  # its lm train overrides (train_overrides)
    job: str | None = None  # its SLURM job id (--launcher=slurm)


def expand_grid(axes: dict[str, list[str]]) -> list[dict[str, str]]:
    """The cartesian product of the axes, the first axis varying slowest: one {key: value} per arm."""
    keys = list(axes)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*axes.values())]


def arm_name(overrides: dict[str, str]) -> str:
    """'model.norm_position=pre,seed=0': a folder name (characters other than letters, digits and
    . _ = , + - become _)."""
    return re.sub(r"[^A-Za-z0-9._=,+-]", "_", ",".join(f"{k}={v}" for k, v in overrides.items()))


def size_overrides(value: str, model) -> dict[str, str]:
    """The model overrides of one value of the size axis (WIDTHxDEPTH or a name of NAMED_SIZES) on a config whose
    model section is model: embed_dim and num_layers; num_heads from the named size, else at model's head
    dimension; num_kv_heads at model's ratio of query to key/value heads; an explicit mlp_hidden_dim scaled by
    the width; under μP, WIDTHxDEPTH sets mup_base_head_dim to the head dimension (unless model sets it), as the
    widths grow the head count. A value that gives no valid model is a UserError."""
    if not all(key in model for key in ("embed_dim", "num_layers", "num_heads", "num_kv_heads")):
        raise UserError(f"--sweep={SIZE_AXIS}=...: the config's model has no embed_dim, num_layers, num_heads and "
                        "num_kv_heads to size")
    group = model.num_heads // model.num_kv_heads  # query heads per key/value head
    if value in NAMED_SIZES:
        width, depth, heads = NAMED_SIZES[value]
    elif match := re.fullmatch(r"([1-9][0-9]*)x([1-9][0-9]*)", value):
        width, depth = int(match[1]), int(match[2])
        head_dim = model.embed_dim // model.num_heads
        if width % head_dim:
            raise UserError(f"--sweep={SIZE_AXIS}={value}: the width {width} is not a multiple of the config's head "
                            f"dimension {head_dim} (model.embed_dim / model.num_heads)")
        heads = width // head_dim
    else:
        raise UserError(f"--sweep={SIZE_AXIS}={value}: write WIDTHxDEPTH (e.g. 256x4) or a named size "
                        f"({', '.join(NAMED_SIZES)})")
    if heads % group:
        raise UserError(f"--sweep={SIZE_AXIS}={value}: its {heads} heads do not split into the config's groups of "
                        f"{group} query heads per key/value head (model.num_heads / model.num_kv_heads)")
    sized = {"model.embed_dim": width, "model.num_layers": depth, "model.num_heads": heads,
             "model.num_kv_heads": heads // group}
    if model.get("mlp_hidden_dim"):
        sized["model.mlp_hidden_dim"] = round(model.mlp_hidden_dim * width / model.embed_dim)
    if model.get("parametrization") == "mup" and not model.get("mup_base_head_dim") and value not in NAMED_SIZES:
        sized["model.mup_base_head_dim"] = model.embed_dim // model.num_heads  # the widths grow the head count
    return {key: str(v) for key, v in sized.items()}


def train_overrides(spec: str, overrides: dict[str, str]) -> dict[str, str]:
    """The --config overrides lm train gets for an arm's overrides: the size axis's value (if any) replaced by the
    model keys it sets (size_overrides, on the config of the other overrides); a size key set as well is a
    UserError."""
    if SIZE_AXIS not in overrides:
        return overrides
    rest = {k: v for k, v in overrides.items() if k != SIZE_AXIS}
    both = [key for key in SIZE_KEYS if key in rest]
    if both:
        raise UserError(f"--sweep={SIZE_AXIS}=... sets {', '.join(both)}: drop {'it' if len(both) == 1 else 'them'} "
                        "from the other axes and overrides")
    return {**rest, **size_overrides(overrides[SIZE_AXIS], resolve_config(spec, rest).model)}


def load_sweep_file(path: str) -> tuple[str, dict[str, list[str]], dict[str, str]]:
    """(config spec, axes, overrides) from a sweep file, values as command-line strings."""
    file = pathlib.Path(path)
    if not file.is_file():
        raise UserError(f"--sweep_file={path}: no such file")
    spec = importlib.util.spec_from_file_location(f"sweep_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not isinstance(getattr(module, "CONFIG", None), str) or not isinstance(getattr(module, "AXES", None), dict):
        raise UserError(f"--sweep_file={path} must define CONFIG (a config spec) and AXES ({{key: [values]}})")
    axes = {}
    for key, values in module.AXES.items():
        if isinstance(values, str | bytes) or not hasattr(values, "__iter__") or not list(values):
            raise UserError(f"--sweep_file={path}: AXES[{key!r}] must be a non-empty list of values")
        axes[key] = [format_value(v) for v in values]
    overrides = {k: format_value(v) for k, v in getattr(module, "OVERRIDES", {}).items()}
    return module.CONFIG, axes, overrides


def plan_sweep(spec: str, axes: dict[str, list[str]], overrides: dict[str, str], workdir: pathlib.Path) -> list[Arm]:
    """The arms of the grid, every one's overrides checked against the config (UserError on the first bad
    one), before anything runs."""
    if not axes:
        raise UserError("no sweep axes: pass --sweep=key=value1,value2,... or a --sweep_file with AXES")
    for key, values in axes.items():
        if not values:
            raise UserError(f"the sweep axis {key} has no values")
    both = sorted(set(axes) & set(overrides))
    if both:
        raise UserError(f"{', '.join(both)} is both a sweep axis and a --config override; drop one")
    arms = []
    for arm_overrides in expand_grid(axes):
        train_flags = train_overrides(spec, {**overrides, **arm_overrides})
        config = resolve_config(spec, train_flags)
        name = arm_name(arm_overrides)
        arms.append(Arm(name, arm_overrides, workdir / name, int(config.train.num_steps), train_flags=train_flags))
    names = [arm.name for arm in arms]
    if len(set(names)) != len(names):
        raise UserError(f"two arms would share a folder name: {names}; make the sweep values distinct")
    return arms


def is_finished(arm: Arm) -> bool:
    """Whether the arm's run has written results.json at (or past) its train.num_steps."""
    path = arm.workdir / RESULTS_FILE
    try:
        return json.loads(path.read_text()).get("step", -1) >= arm.num_steps
    except (OSError, ValueError):
        return False


def train_command(spec: str, overrides: dict[str, str], workdir: pathlib.Path) -> list[str]:
    """The `lm train` command line of an arm: it trains the arm, or resumes it from its folder."""
    return [sys.executable, "-m", "lm", "train", f"--config={spec}", f"--workdir={workdir}",
            *(f"--config.{k}={v}" for k, v in overrides.items())]


def run_arm(spec: str, overrides: dict[str, str], workdir: pathlib.Path) -> int:
    """Trains (or resumes) one arm in a `lm train` subprocess, output appended to
    workdir/train.log; returns its exit code."""
    workdir.mkdir(parents=True, exist_ok=True)
    command = train_command(spec, overrides, workdir)
    with (workdir / LOG_FILE).open("a") as log:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        return subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode


def latest_record(workdir: pathlib.Path) -> dict | None:
    """The last train record (one with a loss) of a run's metrics.jsonl, None before its first."""
    try:
        lines = (workdir / METRICS_FILE).read_text().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        if "loss" in record:
            return record
    return None


def remaining_seconds(arms: list[Arm], records: dict[str, dict | None], now: float, parallel: int) -> float | None:
    """The sweep's time left: each running arm's steps left at its logged steps/s, and the arms not yet
    started at the mean duration of the arms finished so far (else at the running ones' num_steps /
    steps/s), spread over the `parallel` slots. None while there is nothing to go on."""
    running = [a for a in arms if a.status == "running"]
    pending = [a for a in arms if a.status == "pending"]
    if not running and not pending:
        return 0.0
    rates = {a.name: records[a.name]["steps_per_second"] for a in running
             if (records.get(a.name) or {}).get("steps_per_second")}
    finished = [a.seconds for a in arms if a.status == "finished" and a.seconds]
    if finished:
        per_arm = sum(finished) / len(finished)
    elif rates:
        per_arm = sum(a.num_steps / rates[a.name] for a in running if a.name in rates) / len(rates)
    else:
        return None
    left = len(pending) * per_arm
    for arm in running:
        if arm.name in rates:
            left += (arm.num_steps - records[arm.name]["step"]) / rates[arm.name]
        else:
            left += max(per_arm - (now - arm.started), 0.0)
    return left / min(parallel, len(running) + len(pending))


def progress_line(arms: list[Arm], records: dict[str, dict | None], now: float, parallel: int) -> str:
    """'sweep: 2 of 6 arms done | arm 3 seed=2 step 300/2000 loss 2.1234 | arm 4 seed=3 starting |
    ETA 0:12:30' from the arms and each running arm's latest train record (latest_record)."""
    done = sum(a.status not in ("pending", "running") for a in arms)
    parts = [f"sweep: {done} of {len(arms)} arms done"]
    for index, arm in enumerate(arms):
        if arm.status == "running":
            record = records.get(arm.name)
            where = (f"step {record['step']}/{arm.num_steps} loss {record['loss']:.4f}" if record
                     else "starting")
            parts.append(f"arm {index + 1} {arm.name} {where}")
    left = remaining_seconds(arms, records, now, parallel)
    parts.append(f"ETA {format_duration(left)}" if left is not None else "ETA unknown")
    return " | ".join(parts)


def report_progress(arms: list[Arm], parallel: int, every: float, stop: threading.Event) -> None:
    """Prints progress_line every `every` seconds until stop is set, when a running arm logged a train
    record since the last line."""
    last = None
    while not stop.wait(every):
        records = {a.name: latest_record(a.workdir) for a in arms if a.status == "running"}
        seen = {name: record["step"] for name, record in records.items() if record}
        if seen and seen != last:
            print(progress_line(arms, records, time.monotonic(), parallel), flush=True)
            last = seen


def write_record(workdir: pathlib.Path, spec: str, axes: dict, overrides: dict, arms: list[Arm]) -> None:
    record = {
        "config": spec,
        "axes": {k: [parse_value(v) for v in values] for k, values in axes.items()},
        "overrides": {k: parse_value(v) for k, v in overrides.items()},
        "arms": [{"name": a.name, "overrides": {k: parse_value(v) for k, v in a.overrides.items()},
                  "workdir": str(a.workdir), "status": a.status, **({"job": a.job} if a.job else {})}
                 for a in arms],
    }
    (workdir / SWEEP_FILE).write_text(json.dumps(record, indent=2) + "\n")


def run_sweep(spec: str, axes: dict[str, list[str]], overrides: dict[str, str], workdir: str | pathlib.Path,
              parallel: int = 1, runner=run_arm, progress_every: float = PROGRESS_SECONDS) -> list[Arm]:
    """Plans and checks the grid, then runs the arms that have not finished, `parallel` at a time, with
    runner(spec, overrides, arm_workdir) -> exit code, printing each arm's start and end and, every
    progress_every seconds while arms run, a progress line (progress_line). Returns the arms with their
    final status."""
    if parallel < 1:
        raise UserError(f"--parallel={parallel}: must be at least 1")
    workdir = pathlib.Path(workdir).expanduser().absolute()
    arms = plan_sweep(spec, axes, overrides, workdir)
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--workdir={workdir} cannot be created ({e.strerror})") from e
    todo = []
    for arm in arms:
        if is_finished(arm):
            arm.status = "skipped (finished earlier)"
        else:
            todo.append(arm)
    lock = threading.Lock()
    write_record(workdir, spec, axes, overrides, arms)
    print(f"sweep of {len(arms)} arms in {workdir}: {len(arms) - len(todo)} finished earlier, {len(todo)} to run")

    def train(arm: Arm) -> None:
        number = f"arm {arms.index(arm) + 1} of {len(arms)}"
        with lock:
            arm.started = time.monotonic()
            arm.status = "running"
            write_record(workdir, spec, axes, overrides, arms)
        print(f"start {number}: {arm.name}", flush=True)
        code = runner(spec, arm.train_flags, arm.workdir)
        with lock:
            arm.seconds = time.monotonic() - arm.started
            if code in STOPPED_EXIT_CODES or (code == 0 and not is_finished(arm)):
                arm.status = "interrupted"  # a checkpoint was saved: rerunning the sweep resumes it
            elif code != 0:
                arm.status = f"failed (exit {code})"
            else:
                arm.status = "finished"
            write_record(workdir, spec, axes, overrides, arms)
        print(f"{arm.status} {number}: {arm.name} in {format_duration(arm.seconds)}"
              + ("" if code == 0 else f" (see {arm.workdir / LOG_FILE})"), flush=True)

    stop = threading.Event()
    reporter = threading.Thread(target=report_progress, args=(arms, parallel, progress_every, stop), daemon=True)
    reporter.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
            list(pool.map(train, todo))
    finally:
        stop.set()
        reporter.join()
    print(result_line(arms, workdir))
    return arms


def result_line(arms: list[Arm], workdir: pathlib.Path) -> str:
    """A sweep's last line: how its arms ended, where they are, the arm with the lowest final eval loss (its
    summary.json's) and the command that compares them."""
    ended = collections.Counter("finished" if arm.status.startswith("skipped") else arm.status.split(" (")[0]
                                for arm in arms)
    losses = {arm.name: loss for arm in arms if (loss := final_eval_loss(arm.workdir)) is not None}
    best = f"; lowest eval loss {min(losses.values()):.4f} ({min(losses, key=losses.get)})" if losses else ""
    shown = shown_path(workdir)
    return (f"done: {len(arms)} arms in {shown} ({', '.join(f'{n} {how}' for how, n in ended.items())}; {SWEEP_FILE} "
            f"and a folder each){best}; compare them with lm compare {shown}")


def final_eval_loss(workdir: pathlib.Path) -> float | None:
    """The eval loss a run's summary.json records (at its last step), None where there is none."""
    try:
        return json.loads((workdir / SUMMARY_FILE).read_text()).get("eval_loss")
    except (OSError, ValueError):
        return None


def slurm_launcher():
    """lm.launch, which needs submitit: its absence is a UserError saying how to install it."""
    try:
        from lm import launch
    except ModuleNotFoundError as e:
        if e.name != "submitit":
            raise
        raise UserError('--launcher=slurm needs submitit: pip install -e ".[slurm]"') from e
    return launch


def recorded_jobs(workdir: pathlib.Path) -> dict[str, str]:
    """{arm name: job id} of the arms an earlier --launcher=slurm run of the sweep recorded in sweep.json."""
    try:
        arms = json.loads((workdir / SWEEP_FILE).read_text())["arms"]
    except (OSError, ValueError, KeyError):
        return {}
    return {arm["name"]: arm["job"] for arm in arms if arm.get("job")}


def submit_sweep(spec: str, axes: dict[str, list[str]], overrides: dict[str, str], workdir: str | pathlib.Path,
                 folder: str | None = None, cluster: str = "slurm", **resources) -> list[Arm]:
    """Plans and checks the grid, then submits the arms that have neither finished nor a job still pending or
    running (sweep.json's job ids, their state from sacct) as one job array (lm.launch.submit with these
    resources; folder: submitit's, default <workdir>/slurm) and returns, printing the job ids. cluster "local"
    runs the jobs as local processes (submitit's LocalExecutor). Returns the arms."""
    launch = slurm_launcher()
    if cluster == "slurm" and not (shutil.which("sbatch") and shutil.which("srun")):
        raise UserError("--launcher=slurm: sbatch and srun are not on PATH; run lm sweep on a SLURM login node")
    workdir = pathlib.Path(workdir).expanduser().absolute()
    arms = plan_sweep(spec, axes, overrides, workdir)
    folder = str(pathlib.Path(folder).expanduser().absolute()) if folder else str(workdir / "slurm")
    jobs = recorded_jobs(workdir)
    states = launch.job_states(list(jobs.values())) if jobs and cluster == "slurm" else {}
    todo = []
    for arm in arms:
        arm.job = jobs.get(arm.name)
        if is_finished(arm):
            arm.status = "skipped (finished earlier)"
        elif arm.job in states and launch.is_active(states[arm.job]):
            arm.status = f"queued earlier ({states[arm.job].lower()})"
        else:
            todo.append(arm)
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--workdir={workdir} cannot be created ({e.strerror})") from e
    if todo:
        commands = [(train_command(spec, arm.train_flags, arm.workdir), str(arm.workdir / LOG_FILE)) for arm in todo]
        for arm, job in zip(todo, launch.submit(commands, folder, cluster, **resources), strict=True):
            arm.job, arm.status = job, "submitted"
            print(f"submitted arm {arms.index(arm) + 1} of {len(arms)}: {arm.name} as job {job}", flush=True)
    write_record(workdir, spec, axes, overrides, arms)
    ended = collections.Counter(arm.status.split(" (")[0] for arm in arms if arm not in todo)
    earlier = "".join(f"{n} {how}, " for how, n in ended.items())
    array = f" as job {todo[0].job.split('_')[0]}" if todo else ""
    print(f"done: {len(todo)} of {len(arms)} arms submitted{array} in {shown_path(workdir)} ({earlier}submitit's "
          f"logs in {shown_path(pathlib.Path(folder))}); this command with --status shows their progress; rerun it "
          "to resubmit the arms whose jobs end unfinished")
    return arms


def arm_progress(arm: Arm) -> str:
    """'finished', 'step 300/2000' (its metrics.jsonl's latest train record) or 'not started'."""
    if is_finished(arm):
        return "finished"
    record = latest_record(arm.workdir)
    return f"step {record['step']}/{arm.num_steps}" if record else "not started"


def sweep_status(spec: str, axes: dict[str, list[str]], overrides: dict[str, str],
                 workdir: str | pathlib.Path) -> str:
    """A table of the sweep's arms: each one's job id and SLURM state (sacct, for arms sweep.json records a job
    of), its progress (arm_progress) and final eval loss; then a line counting the finished arms."""
    workdir = pathlib.Path(workdir).expanduser().absolute()
    arms = plan_sweep(spec, axes, overrides, workdir)
    if not (workdir / SWEEP_FILE).is_file():
        raise UserError(f"--workdir={workdir} holds no {SWEEP_FILE}: this sweep has not been launched")
    jobs = recorded_jobs(workdir)
    states = slurm_launcher().job_states(list(jobs.values())) if jobs else {}
    rows = [("arm", "job", "state", "progress", "eval loss")]
    for arm in arms:
        job = jobs.get(arm.name)
        loss = final_eval_loss(arm.workdir)
        rows.append((arm.name, job or "-", states.get(job, "-"), arm_progress(arm),
                     "-" if loss is None else f"{loss:.4f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    finished = sum(row[3] == "finished" for row in rows[1:])
    return "\n".join([*lines, f"status: {finished} of {len(arms)} arms finished in {shown_path(workdir)}"])


_OVERRIDES: dict[str, str] = {}


def parse_sweep_flags(argv: list[str]) -> list[str]:
    rest, overrides = split_config_overrides(argv)
    _OVERRIDES.update(overrides)
    return parse_flags(rest)


def main(argv: list[str]) -> None:
    reject_arguments(argv)

    def sweep() -> None:
        if _SWEEP_FILE.value:
            if _CONFIG.value or _SWEEP.value:
                raise UserError("--sweep_file defines the config and the axes: drop --config and --sweep")
            spec, axes, overrides = load_sweep_file(_SWEEP_FILE.value)
        else:
            if not _CONFIG.value:
                raise UserError("pass --config=<file>:<variant> with --sweep axes, or --sweep_file")
            spec, axes, overrides = _CONFIG.value, {}, {}
            for text in _SWEEP.value:
                key, values = parse_axis(text)
                if key in axes:
                    raise UserError(f"--sweep={key}=... is given twice; put all its values in one --sweep")
                axes[key] = values
        overrides = {**overrides, **_OVERRIDES}
        slurm_flags = [f"--{name}" for name in SLURM_FLAGS if flags.FLAGS[name].present]
        if _LAUNCHER.value == "local" and slurm_flags and not _STATUS.value:
            one = len(slurm_flags) == 1
            raise UserError(f"{', '.join(slurm_flags)} {'is' if one else 'are'} for --launcher=slurm: add "
                            f"--launcher=slurm or drop {'it' if one else 'them'}")
        if _LAUNCHER.value == "slurm" and flags.FLAGS["parallel"].present:
            raise UserError("--parallel is for --launcher=local; with slurm use --slurm_array_parallelism")
        if _STATUS.value:
            print(sweep_status(spec, axes, overrides, _WORKDIR.value))
            return
        if _LAUNCHER.value == "slurm":
            submit_sweep(spec, axes, overrides, _WORKDIR.value, _SLURM_FOLDER.value, time_min=_SLURM_TIME.value,
                         gpus_per_node=_SLURM_GPUS.value, cpus_per_task=_SLURM_CPUS.value, mem_gb=_SLURM_MEM.value,
                         partition=_SLURM_PARTITION.value, account=_SLURM_ACCOUNT.value, qos=_SLURM_QOS.value,
                         array_parallelism=_SLURM_ARRAY_PARALLELISM.value)
            return
        arms = run_sweep(spec, axes, overrides, _WORKDIR.value, _PARALLEL.value)
        failed = [arm.name for arm in arms if arm.status.startswith("failed")]
        if failed:
            print(f"{len(failed)} of {len(arms)} arms failed: {', '.join(failed)}", file=sys.stderr)
            sys.exit(1)

    run_user_errors(sweep)


def run() -> None:
    """The command: flags from sys.argv, then main."""
    app.run(main, flags_parser=parse_sweep_flags)
