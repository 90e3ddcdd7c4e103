"""Multi-process training with jax.distributed: two processes on localhost with 4 CPU devices each
train exactly as one process with 8 devices, and their checkpoint restores on other meshes."""

import json
import pathlib
import signal
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import REPO, packed_source_config, packed_source_overrides, subprocess_env

from lm import distributed
from lm.cli.resolve import build_experiment
from lm.errors import UserError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def losses(workdir: pathlib.Path) -> dict[int, float]:
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


@pytest.mark.slow
def test_two_processes_match_one_stop_together_and_restore_on_other_meshes(tmp_path, data_dir):
    """2 processes x 4 devices (a data 8 mesh), coordinated by jax.distributed over localhost (gloo
    collectives) and started as on two nodes by the plain multi-node launcher, train as 1 process x 8
    devices on a data 4 x fsdp 2 mesh does.
    Preemption reaches the hosts at different moments: SIGTERM to process 0 alone after step 6, and
    both agree (every log_every steps) on the step they save, then exit 128 + SIGTERM. That checkpoint
    continues in 1 process on another mesh exactly as the uninterrupted run. The data: documents packed by
    document (a data.source), so the batches of two processes, and of one after the resume, are the same."""
    from lm.train.loop import train
    from lm.train.setup import restore_params

    overrides = packed_source_overrides(data_dir, tmp_path)
    multi = tmp_path / "multi"
    env = subprocess_env(devices=4, PYTHON=sys.executable, COORDINATOR=f"localhost:{free_port()}", NUM_NODES="2")
    processes = [
        subprocess.Popen(
            ["bash", "launch/multinode.sh", "--config=configs/gpt2.py:test", f"--workdir={multi}",
             "--config.train.num_steps=100000", "--config.train.log_every=2", "--config.eval.every=100000",
             "--config.train.checkpoint_every=100000", "--config.optimizer.decay_steps=20",
             *(f"--config.{key}={value}" for key, value in overrides.items())],
            cwd=REPO, env={**env, "NODE_RANK": str(i)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for i in range(2)
    ]
    for line in processes[0].stdout:
        if line.startswith("step      6 | loss"):
            processes[0].send_signal(signal.SIGTERM)  # process 1 gets nothing
            break
    outputs = [p.communicate(timeout=300) for p in processes]
    saved = []
    for p, (_, err) in zip(processes, outputs, strict=True):
        assert p.returncode == 128 + signal.SIGTERM, err[-3000:]
        saved.append(int(err.split("SIGTERM: saved a checkpoint at step ")[1].split(";")[0]))
    stop = saved[0]
    assert saved[1] == stop and stop % 2 == 0 and stop >= 6
    assert [p.name for p in (multi / "checkpoints").iterdir() if p.name.isdigit()] == [str(stop)]
    assert "process 1 of 2" in outputs[1][1]
    assert "loss" not in outputs[1][0]  # process 0 alone reports

    # 1 process x 8 devices on another mesh (data 4 x fsdp 2), without a break.
    test_config = packed_source_config(overrides)
    test_config.train.update(num_steps=stop + 4, log_every=2, checkpoint_every=100000)
    test_config.optimizer.decay_steps = 20  # the schedule of the 2-process run
    test_config.eval.every = 100000
    test_config.mesh.update(data=4, fsdp=2)
    single = tmp_path / "single"
    train(test_config, str(single), build_experiment, devices=jax.devices())
    single_losses, multi_losses = losses(single), losses(multi)
    assert sorted(multi_losses) == list(range(2, stop + 1, 2))
    np.testing.assert_allclose([multi_losses[s] for s in sorted(multi_losses)],
                               [single_losses[s] for s in sorted(multi_losses)], rtol=1e-5)

    # The 2-process checkpoint continues in 1 process on that mesh (the same compiled programs) ...
    train(test_config, str(multi), build_experiment, devices=jax.devices())
    resumed = losses(multi)
    after = (stop + 2, stop + 4)
    np.testing.assert_allclose([resumed[s] for s in after], [single_losses[s] for s in after], rtol=1e-4)
    # ... and its final parameters load on a single device, equal to the uninterrupted run's (up to
    # the summation order of the gradient reductions; Adam turns the noise on near-zero gradients
    # into updates, hence the absolute tolerance).
    experiment = build_experiment(test_config)
    for a, b in zip(jax.tree.leaves(restore_params(test_config, experiment, multi)),
                    jax.tree.leaves(restore_params(test_config, experiment, single)), strict=True):
        assert len(a.devices()) == 1
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


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
