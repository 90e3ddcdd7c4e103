"""`lm sweep --launcher=slurm`: the arms as one SLURM job array through submitit, tested without a cluster: a
fake sbatch, srun and sacct on PATH (the submission script, job ids, resubmission and --status), and submitit's
local executor running the arms' jobs to the end (the code path of a SLURM element)."""

import json
import os
import pathlib
import signal
import sys
import time

import pytest
import submitit
from conftest import subprocess_env
from test_cli import assert_user_error, snapshot
from test_sweep import TEST_CONFIG, sweep_in_process

import lm
from lm.cli import sweep

FAKE_SBATCH = """#!/bin/sh
# records the submission script, answers as sbatch does with the next job id (from 1234)
if grep -q -- "--partition=nope" "$1"; then echo "sbatch: error: invalid partition specified: nope" >&2; exit 1; fi
n=$(cat "$FAKE_SLURM/next_id" 2>/dev/null || echo 1234)
echo $((n + 1)) > "$FAKE_SLURM/next_id"
cp "$1" "$FAKE_SLURM/submitted_$n.sh"
echo "Submitted batch job $n"
"""
FAKE_SACCT = """#!/bin/sh
echo "JobID|State|NodeList"
cat "$FAKE_SLURM/sacct.txt" 2>/dev/null
"""


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch) -> pathlib.Path:
    """A folder of fake sbatch, srun and sacct first on PATH; sacct prints its sacct.txt (JobID|State|NodeList
    lines). submitit's cache of job states starts empty."""
    folder = tmp_path / "fake_slurm"
    folder.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH), ("srun", "#!/bin/sh\nexit 0\n"), ("sacct", FAKE_SACCT)):
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    monkeypatch.setenv("FAKE_SLURM", str(folder))
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    submitit.SlurmJob.watcher.clear()
    return folder


RESOURCES = ["--slurm_partition=gpu", "--slurm_time=90", "--slurm_gpus_per_node=2", "--slurm_cpus_per_task=6",
             "--slurm_mem_gb=32", "--slurm_account=proj", "--slurm_qos=high", "--slurm_array_parallelism=2"]


def test_the_arms_are_one_job_array_with_the_flags_resources(tmp_path, capsys, monkeypatch, fake_slurm):
    workdir = tmp_path / "sweep"
    result = sweep_in_process(capsys, monkeypatch, f"--config={TEST_CONFIG}", "--sweep=seed=0,1,2",
                              f"--workdir={workdir}", "--config.train.num_steps=7", "--launcher=slurm", *RESOURCES)
    assert result.returncode == 0, result.stderr
    script = (fake_slurm / "submitted_1234.sh").read_text()
    sbatch_lines = {line for line in script.splitlines() if line.startswith("#SBATCH")}
    assert {"#SBATCH --array=0-2%2", "#SBATCH --partition=gpu", "#SBATCH --time=90", "#SBATCH --gpus-per-node=2",
            "#SBATCH --cpus-per-task=6", "#SBATCH --mem=32GB", "#SBATCH --account=proj", "#SBATCH --qos=high",
            "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1", "#SBATCH --requeue",
            "#SBATCH --signal=USR2@120"} <= sbatch_lines, script
    names = ["seed=0", "seed=1", "seed=2"]
    for index, name in enumerate(names):
        assert f"submitted arm {index + 1} of 3: {name} as job 1234_{index}" in result.stdout
    assert result.stdout.splitlines()[-1].startswith(f"done: 3 of 3 arms submitted as job 1234 in {workdir} (")
    record = json.loads((workdir / "sweep.json").read_text())
    assert [(a["name"], a["status"], a["job"]) for a in record["arms"]] == [
        (name, "submitted", f"1234_{i}") for i, name in enumerate(names)]
    for index, name in enumerate(names):  # each element runs its arm's lm train command, logged in its folder
        job = submitit.SlurmJob(folder=workdir / "slurm", job_id=f"1234_{index}").submission().function
        assert job.command[1:] == ["-m", "lm", "train", f"--config={TEST_CONFIG}", f"--workdir={workdir / name}",
                                   "--config.train.num_steps=7", f"--config.seed={index}"]
        assert (job.cwd, job.log) == (os.getcwd(), str(workdir / name / "train.log"))


def test_a_rerun_resubmits_only_the_arms_whose_jobs_ended_unfinished_and_status_shows_them(
        tmp_path, capsys, monkeypatch, fake_slurm):
    workdir = tmp_path / "sweep"
    args = [f"--config={TEST_CONFIG}", "--sweep=seed=0,1,2", f"--workdir={workdir}", "--config.train.num_steps=7",
            "--launcher=slurm"]
    assert sweep_in_process(capsys, monkeypatch, *args).returncode == 0
    for name in ("seed=0", "seed=1"):  # as their jobs would have
        (workdir / name).mkdir()
    (workdir / "seed=0" / "results.json").write_text(json.dumps({"step": 7}))  # finished
    (workdir / "seed=1" / "metrics.jsonl").write_text(json.dumps({"step": 3, "loss": 2.5}) + "\n")
    (fake_slurm / "sacct.txt").write_text("1234_0|COMPLETED|n1\n1234_1|RUNNING|n2\n1234_2|FAILED|n3\n")

    result = sweep_in_process(capsys, monkeypatch, *args)
    assert result.returncode == 0, result.stderr
    assert "submitted arm 3 of 3: seed=2 as job 1235" in result.stdout and "seed=1 as" not in result.stdout
    assert result.stdout.splitlines()[-1].startswith(
        f"done: 1 of 3 arms submitted as job 1235 in {workdir} (1 skipped, 1 queued earlier, submitit's logs in ")
    assert "#SBATCH --array" not in (fake_slurm / "submitted_1235.sh").read_text()  # one arm: a plain job
    record = json.loads((workdir / "sweep.json").read_text())
    assert [(a["status"], a["job"]) for a in record["arms"]] == [
        ("skipped (finished earlier)", "1234_0"), ("queued earlier (running)", "1234_1"), ("submitted", "1235")]

    (fake_slurm / "sacct.txt").write_text("1234_0|COMPLETED|n1\n1234_1|RUNNING|n2\n1235|PENDING|\n")
    submitit.SlurmJob.watcher.clear()
    before = snapshot(workdir)
    result = sweep_in_process(capsys, monkeypatch, *args, "--status")
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()]
    assert rows[1:4] == [["seed=0", "1234_0", "COMPLETED", "finished", "-"],
                         ["seed=1", "1234_1", "RUNNING", "step", "3/7", "-"],
                         ["seed=2", "1235", "PENDING", "not", "started", "-"]]
    assert result.stdout.splitlines()[-1] == f"status: 1 of 3 arms finished in {workdir}"
    assert snapshot(workdir) == before and not (fake_slurm / "submitted_1236.sh").exists()


@pytest.mark.parametrize("args, message", [
    (["--slurm_partition=gpu", "--slurm_time=60"], "--slurm_partition, --slurm_time are for --launcher=slurm"),
    (["--launcher=slurm", "--parallel=2"], "--parallel is for --launcher=local"),
    (["--status"], "holds no sweep.json"),
])
def test_slurm_flag_mistakes_are_one_line_and_write_nothing(tmp_path, capsys, monkeypatch, fake_slurm, args,
                                                            message):
    workdir = tmp_path / "sweep"
    result = sweep_in_process(capsys, monkeypatch, f"--config={TEST_CONFIG}", "--sweep=seed=0,1",
                              f"--workdir={workdir}", *args)
    assert_user_error(result, message)
    assert not workdir.exists() and not list(fake_slurm.glob("submitted_*"))


def test_sbatch_refusing_the_array_is_one_line(tmp_path, capsys, monkeypatch, fake_slurm):
    workdir = tmp_path / "sweep"
    result = sweep_in_process(capsys, monkeypatch, f"--config={TEST_CONFIG}", "--sweep=seed=0,1",
                              f"--workdir={workdir}", "--launcher=slurm", "--slurm_partition=nope")
    assert_user_error(result, "sbatch refused", "invalid partition specified: nope", str(workdir / "slurm"))
    assert not (workdir / "sweep.json").exists() and not (workdir / "seed=0").exists()


def test_slurm_without_submitit_or_sbatch_says_what_is_missing(tmp_path, capsys, monkeypatch):
    workdir = tmp_path / "sweep"
    args = [f"--config={TEST_CONFIG}", "--sweep=seed=0,1", f"--workdir={workdir}", "--launcher=slurm"]
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch
    assert_user_error(sweep_in_process(capsys, monkeypatch, *args), "sbatch and srun are not on PATH")
    monkeypatch.setitem(sys.modules, "submitit", None)  # not installed
    monkeypatch.delitem(sys.modules, "lm.launch", raising=False)
    monkeypatch.delattr(lm, "launch", raising=False)
    assert_user_error(sweep_in_process(capsys, monkeypatch, *args), 'pip install -e ".[slurm]"')
    assert not workdir.exists()


@pytest.mark.slow
def test_the_arms_jobs_train_to_the_end_under_submitits_local_executor(tmp_path, data_dir, monkeypatch):
    """The jobs --launcher=slurm submits, run by submitit's local executor (as SLURM elements, one process
    each): both arms train to train.num_steps in their folders; a rerun finds them finished."""
    monkeypatch.chdir(pathlib.Path(__file__).resolve().parents[1])
    monkeypatch.setenv("XLA_FLAGS", subprocess_env()["XLA_FLAGS"])  # one CPU device, fast compiles
    workdir = tmp_path / "sweep"
    overrides = {"train.num_steps": "4", "train.log_every": "2", "eval.every": "4", "eval.num_batches": "1",
                 "sample.max_new_tokens": "0"}
    arms = sweep.submit_sweep(TEST_CONFIG, {"seed": ["0", "1"]}, overrides, workdir, cluster="local", time_min=10)
    results = [submitit.core.utils.JobPaths(workdir / "slurm", arm.job).result_pickle for arm in arms]
    deadline = time.monotonic() + 600
    while not all(path.exists() for path in results) and time.monotonic() < deadline:
        time.sleep(1)
    for arm, path in zip(arms, results, strict=True):
        outcome, value = submitit.core.utils.pickle_load(path)
        assert (outcome, value) == ("success", 0), (value, (arm.workdir / "train.log").read_text()[-3000:])
        assert json.loads((arm.workdir / "results.json").read_text())["step"] == 4
        assert (arm.workdir / "train.log").read_text().startswith(f"$ {sys.executable} -m lm train")
    again = sweep.submit_sweep(TEST_CONFIG, {"seed": ["0", "1"]}, overrides, workdir, cluster="local")
    assert [arm.status for arm in again] == ["skipped (finished earlier)"] * 2


def submitit_task_pids(folder: pathlib.Path) -> list[int]:
    """The processes running a submitit job of folder (`python -u -m submitit.core._submit <folder>`)."""
    pids = []
    for proc in pathlib.Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0") if proc.name.isdigit() else []
        except OSError:
            continue
        if b"submitit.core._submit" in argv and str(folder).encode() in argv:
            pids.append(int(proc.name))
    return pids


@pytest.mark.slow
def test_an_arm_signalled_before_its_time_limit_saves_a_checkpoint_is_requeued_and_resumes(
        tmp_path, data_dir, monkeypatch):
    """The signal SLURM sends an element before its time limit (SIGUSR2), here to a job of submitit's local
    executor once the arm has trained 50 steps: ArmJob.checkpoint stops lm train with SIGTERM, which saves a
    checkpoint, and the requeued job reruns the command, which resumes from it to the arm's last step."""
    monkeypatch.chdir(pathlib.Path(__file__).resolve().parents[1])
    monkeypatch.setenv("XLA_FLAGS", subprocess_env()["XLA_FLAGS"])
    workdir = tmp_path / "sweep"
    overrides = {"train.num_steps": "600", "train.log_every": "10", "eval.every": "600", "eval.num_batches": "1",
                 "sample.max_new_tokens": "0"}
    (arm,) = sweep.submit_sweep(TEST_CONFIG, {"seed": ["0"]}, overrides, workdir, cluster="local", time_min=10)
    deadline = time.monotonic() + 600
    while ((sweep.latest_record(arm.workdir) or {}).get("step", 0) < 50 and not sweep.is_finished(arm)
           and time.monotonic() < deadline):
        time.sleep(0.2)
    (pid,) = submitit_task_pids(workdir / "slurm")
    os.kill(pid, signal.SIGUSR2)
    result = submitit.core.utils.JobPaths(workdir / "slurm", arm.job).result_pickle
    while not result.exists() and time.monotonic() < deadline:
        time.sleep(1)
    log = (arm.workdir / "train.log").read_text()
    assert submitit.core.utils.pickle_load(result) == ("success", 0), log[-3000:]
    assert json.loads((arm.workdir / "results.json").read_text())["step"] == 600
    assert "SIGTERM: saved a checkpoint at step" in log and "resumed from step" in log, log[-3000:]
    assert log.count("$ ") == 2  # the same command, rerun by the requeued job
