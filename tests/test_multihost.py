"""Multi-process training with jax.distributed: two processes on localhost with 4 CPU devices each
train exactly as one process with 8 devices, and their checkpoint restores on other meshes."""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from lm import distributed
from lm.errors import UserError

REPO = pathlib.Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def losses(workdir: pathlib.Path) -> dict[int, float]:
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def test_two_processes_match_one_and_restore_on_other_meshes(tmp_path, data_dir, test_config):
    from lm.train.loop import train
    from lm.train.setup import load_experiment, restore_params

    test_config.train.update(num_steps=12, log_every=1, checkpoint_every=6)
    overrides = ["--config.train.log_every=1", "--config.train.checkpoint_every=6", "--config.sample.max_new_tokens=5"]

    # 2 processes x 4 devices, coordinated by jax.distributed over localhost (gloo collectives), 6 steps.
    multi = tmp_path / "multi"
    address = f"localhost:{free_port()}"
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "PYTHON": sys.executable,
           "COORDINATOR": address, "NUM_NODES": "2"}
    processes = [  # started as on two nodes, by the plain multi-node launcher
        subprocess.Popen(
            ["bash", "launch/multinode.sh", "--config=configs/gpt_shakespeare.py:test", f"--workdir={multi}",
             "--config.train.num_steps=6", *overrides],
            cwd=REPO, env={**env, "NODE_RANK": str(i)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in processes]
    for p, (_, err) in zip(processes, outputs, strict=True):
        assert p.returncode == 0, err[-3000:]
    assert "process 1 of 2" in outputs[1][1]
    assert "step      6 | loss" in outputs[0][0] and "loss" not in outputs[1][0]  # process 0 alone reports
    assert (multi / "checkpoints" / "6").is_dir()

    # 1 process x 8 devices, 12 steps without a break.
    single = tmp_path / "single"
    train(test_config, str(single), devices=jax.devices())
    single_losses, multi_losses = losses(single), losses(multi)
    assert sorted(multi_losses) == list(range(1, 7))
    np.testing.assert_allclose([multi_losses[s] for s in range(1, 7)], [single_losses[s] for s in range(1, 7)],
                               rtol=1e-5)

    # The 2-process checkpoint continues in 1 process on another mesh (data 4 x fsdp 2) to step 12 ...
    test_config.mesh.update(data=4, fsdp=2)
    train(test_config, str(multi), devices=jax.devices())
    resumed = losses(multi)
    np.testing.assert_allclose([resumed[s] for s in range(7, 13)], [single_losses[s] for s in range(7, 13)],
                               rtol=1e-4)
    # ... and its final parameters load on a single device, equal to the uninterrupted run's (up to
    # the summation order of the gradient reductions; Adam turns the noise on near-zero gradients
    # into updates, hence the absolute tolerance).
    experiment = load_experiment(test_config)
    for a, b in zip(jax.tree.leaves(restore_params(test_config, experiment, multi)),
                    jax.tree.leaves(restore_params(test_config, experiment, single)), strict=True):
        assert len(a.devices()) == 1
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_sigterm_to_one_process_stops_both_after_the_same_step(tmp_path, data_dir):
    """Preemption may reach the hosts at different moments: they agree (every log_every steps) and
    all save the same step, then exit 128 + SIGTERM."""
    workdir = tmp_path / "run"
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "PYTHON": sys.executable,
           "COORDINATOR": f"localhost:{free_port()}", "NUM_NODES": "2"}
    processes = [
        subprocess.Popen(
            ["bash", "launch/multinode.sh", "--config=configs/gpt_shakespeare.py:test", f"--workdir={workdir}",
             "--config.train.num_steps=100000", "--config.train.log_every=2", "--config.eval.every=100000",
             "--config.train.checkpoint_every=100000"],
            cwd=REPO, env={**env, "NODE_RANK": str(i)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for i in range(2)
    ]
    for line in processes[0].stdout:
        if line.startswith("step      4 | loss"):
            processes[0].send_signal(signal.SIGTERM)  # process 1 gets nothing
            break
    outputs = [p.communicate(timeout=300) for p in processes]
    saved = []
    for p, (_, err) in zip(processes, outputs, strict=True):
        assert p.returncode == 128 + signal.SIGTERM, err[-3000:]
        saved.append(int(err.split("SIGTERM: saved a checkpoint at step ")[1].split(";")[0]))
    assert saved[0] == saved[1] and saved[0] % 2 == 0 and saved[0] >= 4
    assert [p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()] == [str(saved[0])]


def test_single_process_never_initializes(monkeypatch):
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: calls.append((a, k)))
    for name in (*distributed.EXPLICIT_ENV, "SLURM_JOB_ID", "OMPI_MCA_orte_hnp_uri"):
        monkeypatch.delenv(name, raising=False)
    assert distributed.initialize() is None
    assert distributed.initialize("localhost:1234", 1, 0) is None  # one process: nothing to coordinate
    # A SLURM allocation of one task is a single process too.
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_STEP_NODELIST", "node1")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_LOCALID", "0")
    assert distributed.initialize() is None
    assert calls == []
    # Two SLURM tasks: JAX's own detection takes over (coordinator, ids from the environment).
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setattr(jax, "process_index", lambda: 0)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    assert distributed.initialize() == "process 0 of 2 (SlurmCluster)"
    assert calls == [((), {})]


def test_explicit_settings_from_flags_or_environment(monkeypatch):
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: calls.append(a))
    assert distributed.initialize("host0:1234", 4, 3) == "process 3 of 4, coordinator host0:1234"
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "host0:99")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    monkeypatch.setenv("JAX_PROCESS_ID", "1")
    assert distributed.initialize() == "process 1 of 2, coordinator host0:99"
    assert calls == [("host0:1234", 4, 3), ("host0:99", 2, 1)]
    monkeypatch.delenv("JAX_PROCESS_ID")
    with pytest.raises(UserError, match="needs all of --coordinator_address, --num_processes and --process_id"):
        distributed.initialize()
    with pytest.raises(UserError, match=r"--process_id=5 is not in \[0, --num_processes=2\)"):
        distributed.initialize(process_id=5)
    monkeypatch.setenv("JAX_PROCESS_ID", "one")
    with pytest.raises(UserError, match="JAX_PROCESS_ID='one' is not an integer"):
        distributed.initialize()
