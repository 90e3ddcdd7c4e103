"""CPU device policy: one single-threaded device per core, as many as split the batch."""

import os
import subprocess
import sys

from conftest import REPO
from lm.cpu import configure_cpu_devices, device_count_for


def test_device_count_splits_the_batch_over_at_most_one_device_per_core():
    assert device_count_for(12, cores=2) == 2
    assert device_count_for(12, cores=16) == 12
    assert device_count_for(64, cores=12) == 8
    assert device_count_for(7, cores=2) == 1


def test_flags_are_set_before_jax_starts_and_an_explicit_count_wins(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=3")
    assert configure_cpu_devices(12, cores=2) == 0
    assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=3"
    monkeypatch.setenv("XLA_FLAGS", "")
    assert configure_cpu_devices(12, cores=2) == 2
    code = "import jax; print(jax.device_count())"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "JAX_PLATFORMS": "cpu"}, cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "2"
