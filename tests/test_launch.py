"""The launch scripts build the commands the README documents: run with stand-ins for gcloud and srun
that record their arguments (the real multi-node launcher is run in test_multihost.py)."""

import os
import pathlib
import shlex
import stat
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def recorder(tmp_path):
    """A PATH whose gcloud and srun append their argument lists (one JSON-free line each) to a log."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    for name in ("gcloud", "srun"):
        tool = bin_dir / name
        tool.write_text(f'#!/usr/bin/env bash\nprintf "{name}" >> {log}\nprintf " %q" "$@" >> {log}\necho >> {log}\n')
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def run(*args, **extra_env):
        result = subprocess.run(list(args), cwd=REPO, env={**env, **extra_env}, capture_output=True, text=True)
        calls = [shlex.split(line) for line in log.read_text().splitlines()] if log.exists() else []
        log.unlink(missing_ok=True)
        return result, calls

    return run


def test_tpu_vm_script_runs_one_command_on_every_host(recorder):
    tpu = {"TPU_NAME": "lm-pod", "ZONE": "us-central2-b"}
    result, calls = recorder("bash", "launch/tpu_vm.sh", "start", "--config=configs/gpt_shakespeare.py:small",
                             "--workdir=runs/my run", "--config.train.checkpoint_dir=gs://b/run", **tpu)
    assert result.returncode == 0, result.stderr
    (call,) = calls
    assert call[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "lm-pod"]
    assert "--worker=all" in call and "--zone=us-central2-b" in call
    remote = next(a for a in call if a.startswith("--command=")).removeprefix("--command=")
    # The remote shell sees one `lm train` command, with the space in the workdir kept.
    words = shlex.split(remote.split(">")[0].removeprefix("nohup "))
    assert words[words.index("python3"):] == ["python3", "-m", "lm", "train",
                                             "--config=configs/gpt_shakespeare.py:small",
                                             "--workdir=runs/my run", "--config.train.checkpoint_dir=gs://b/run"]
    assert remote.rstrip().endswith("&") and "~/lm.log" in remote

    result, calls = recorder("bash", "launch/tpu_vm.sh", "setup", **tpu, LM_REPO="https://example.org/lm.git")
    assert result.returncode == 0 and "pip install -q -e ~/lm[tpu]" in calls[0][-1]
    assert "git clone https://example.org/lm.git ~/lm" in calls[0][-1]

    result, calls = recorder("bash", "launch/tpu_vm.sh", "stop", **tpu)
    assert "pkill -TERM -f 'python3 -m lm train'" in calls[0][-1]  # SIGTERM: checkpoint, then exit

    result, calls = recorder("bash", "launch/tpu_vm.sh", "create", **tpu)
    assert result.returncode != 0 and "set ACCELERATOR_TYPE" in result.stderr and not calls
    result, _ = recorder("bash", "launch/tpu_vm.sh", "launch", **tpu)
    assert result.returncode == 2 and "usage:" in result.stderr


def test_slurm_script_runs_lm_train_in_every_task(recorder):
    text = (REPO / "launch" / "slurm.sbatch").read_text()
    assert "#SBATCH --ntasks-per-node=8" in text and "#SBATCH --gpus-per-node=8" in text  # one task per GPU
    result, calls = recorder("bash", "launch/slurm.sbatch", "--config=configs/gpt_shakespeare.py:small",
                             "--workdir=/shared/runs/small")
    assert result.returncode == 0, result.stderr
    assert calls == [["srun", "--kill-on-bad-exit=1", "python", "-m", "lm", "train",
                      "--config=configs/gpt_shakespeare.py:small", "--workdir=/shared/runs/small"]]


def test_multinode_script_names_what_is_missing(recorder):
    env = {k: "" for k in ("COORDINATOR", "NUM_NODES", "NODE_RANK")}
    result, _ = recorder("bash", "launch/multinode.sh", "--config=configs/gpt_shakespeare.py:test", **env)
    assert result.returncode != 0 and "set COORDINATOR=host:port of node 0" in result.stderr


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "launch").glob("*.sh*")) + ["slurm.sbatch"])
def test_launch_scripts_parse(script):
    result = subprocess.run(["bash", "-n", str(REPO / "launch" / script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
