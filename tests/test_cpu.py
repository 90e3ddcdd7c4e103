"""The host-memory set-up applies in a fresh process, before jax starts."""

import subprocess
import sys

from conftest import REPO

SCRIPT = """
from lm.cpu import keep_freed_memory
assert keep_freed_memory()
import jax
print(jax.numpy.ones(3).sum())
"""


def test_keep_freed_memory_applies_on_glibc():
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "3.0"
