"""lm's XLA flags: the GPU defaults on a GPU only, after the user's own (which win), set by the `lm` command
before a backend starts; every flag exists in the installed XLA."""

import subprocess
import sys

import pytest
from conftest import subprocess_env

from lm import xla_flags
from lm.cli import main
from lm.xla_flags import GPU_FLAGS, composed_flags

LATENCY_HIDING = "--xla_gpu_enable_latency_hiding_scheduler"


def test_a_gpu_gets_the_defaults_after_the_users_flags():
    assert composed_flags("gpu", "") == " ".join(GPU_FLAGS)
    user = f"--xla_dump_to=/tmp/dump {LATENCY_HIDING}=false"
    flags = composed_flags("gpu", user)
    assert flags.startswith(user) and flags.count(LATENCY_HIDING) == 1  # the user's value wins
    assert flags.split()[2:] == [flag for flag in GPU_FLAGS if not flag.startswith(LATENCY_HIDING)]
    assert composed_flags("gpu", f"{LATENCY_HIDING} {' '.join(GPU_FLAGS[1:])}") == (
        f"{LATENCY_HIDING} {' '.join(GPU_FLAGS[1:])}")  # a bare flag counts as set


@pytest.mark.parametrize("platform", ["cpu", "tpu", "other"])
def test_other_platforms_get_none_of_the_gpu_flags(platform):
    assert composed_flags(platform, "") == ""
    assert composed_flags(platform, "--xla_force_host_platform_device_count=8") == (
        "--xla_force_host_platform_device_count=8")


@pytest.mark.parametrize("platforms, expected", [("cuda", "gpu"), ("rocm,cpu", "gpu"), ("cpu", "cpu"),
                                                 ("tpu", "tpu"), ("", "other")])
def test_the_platform_comes_from_jax_platforms_or_an_installed_gpu_plugin(monkeypatch, platforms, expected):
    monkeypatch.setenv("JAX_PLATFORMS", platforms)
    monkeypatch.setitem(sys.modules, "jax_plugins", None)  # no plugin installed (as on this machine)
    assert xla_flags.platform() == expected


def test_an_installed_cuda_plugin_means_a_gpu(monkeypatch, tmp_path):
    """jax's CUDA plugin installs the module jax_plugins.xla_cuda<version>; the platform is then the GPU."""
    (tmp_path / "jax_plugins" / "xla_cuda13").mkdir(parents=True)
    (tmp_path / "jax_plugins" / "xla_cuda13" / "__init__.py").write_text("")
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "jax_plugins", raising=False)
    assert xla_flags.platform() == "gpu"


def test_the_lm_command_sets_the_gpu_flags_before_it_imports_the_command(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    monkeypatch.setenv("XLA_FLAGS", f"{LATENCY_HIDING}=false")
    for name, value in (("argv", sys.argv), ("path", list(sys.path))):  # (main sets them for the command)
        monkeypatch.setattr(sys, name, value)
    monkeypatch.setattr("lm.cli.steady_streams", lambda: None)  # (pytest's streams stay as they are)
    with pytest.raises(SystemExit):
        main(["lm", "sample", "--help"])
    assert xla_flags.os.environ["XLA_FLAGS"] == composed_flags("gpu", f"{LATENCY_HIDING}=false")


@pytest.mark.slow
def test_every_gpu_flag_exists_in_the_installed_xla():
    """XLA parses every flag of $XLA_FLAGS whatever the backend, and stops at one it does not know: the CPU
    backend starts with the GPU defaults, not with a flag XLA has removed (so a renamed flag fails here)."""
    def starts(flags: str) -> bool:
        return subprocess.run([sys.executable, "-c", "import jax; jax.numpy.zeros(1).block_until_ready()"],
                              env=subprocess_env(XLA_FLAGS=flags, JAX_PLATFORMS="cpu"), capture_output=True,
                              timeout=120).returncode == 0

    assert starts(composed_flags("gpu", ""))
    assert not starts("--xla_gpu_graph_level=0")  # removed from XLA in 2024
