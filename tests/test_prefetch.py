"""train.prefetch (DevicePrefetcher) and train.compilation_cache_dir, without training."""

import threading
import time

import jax
import numpy as np
import pytest

from lm import sharding
from lm.errors import UserError
from lm.train.prefetch import DevicePrefetcher


def host_batches(count, fail_at=None):
    for k in range(count):
        if k == fail_at:
            raise UserError(f"token id 99 at batch {k} is outside the vocabulary")
        yield {"inputs": np.full((8, 4), k, np.int32), "targets": np.arange(32, dtype=np.int32).reshape(8, 4) + k}


@pytest.fixture(scope="module")
def place():
    mesh = sharding.make_mesh({"data": -1, "fsdp": 1, "expert": 1, "tensor": 1})  # the 8 test devices
    return lambda b: sharding.assemble_batch(b, mesh, 8)


@pytest.mark.parametrize("size", [0, 1, 3])
def test_the_same_device_batches_in_the_same_order(place, size):
    plain = [place(b) for b in host_batches(6)]
    with DevicePrefetcher(host_batches(6), place, size) as prefetched:
        got = list(prefetched)
    assert len(got) == len(plain)
    for a, b in zip(got, plain, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key].sharding == b[key].sharding
            np.testing.assert_array_equal(a[key], b[key])


@pytest.mark.parametrize("size", [0, 2])
def test_an_error_at_batch_k_comes_out_at_batch_k_with_its_type(size):
    prefetched = DevicePrefetcher(host_batches(6, fail_at=3), lambda b: b, size)
    assert [int(next(prefetched)["inputs"][0, 0]) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(UserError, match="token id 99 at batch 3"):
        next(prefetched)
    prefetched.close()


def test_size_0_runs_in_the_callers_thread():
    threads = []
    prefetched = DevicePrefetcher(range(3), lambda x: threads.append(threading.current_thread()) or x, 0)
    assert list(prefetched) == [0, 1, 2]
    assert threads == [threading.main_thread()] * 3 and prefetched._thread is None


def test_close_while_the_thread_waits_on_a_full_queue():
    produced = []

    def endless():
        k = 0
        while True:
            produced.append(k)
            yield k
            k += 1

    prefetched = DevicePrefetcher(endless(), lambda x: x, 2)
    assert next(prefetched) == 0
    deadline = time.monotonic() + 5
    while len(produced) < 4 and time.monotonic() < deadline:  # 2 queued, the next one waiting to go in
        time.sleep(0.01)
    start = time.monotonic()
    prefetched.close()
    assert time.monotonic() - start < 1
    assert not prefetched._thread.is_alive()
    assert len(produced) == 4  # it stopped reading
    with pytest.raises(RuntimeError, match="after close"):
        next(prefetched)


def test_a_negative_prefetch_is_a_user_error(test_config):
    from lm.cli.resolve import build_experiment
    from lm.train.setup import build

    test_config.train.prefetch = -1
    with pytest.raises(UserError, match=r"train.prefetch=-1"):
        build(test_config, build_experiment, None)


def test_compilation_cache_dir_takes_over_from_the_cache_in_use(tmp_path):
    """In this process JAX has opened the suite's cache (or none) already; the option switches to its
    directory all the same. An unwritable one is a UserError."""
    from jax.experimental.compilation_cache import compilation_cache

    from lm.train.setup import use_compilation_cache

    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(UserError, match="not writable.*compilation_cache_dir"):
        use_compilation_cache(str(blocker / "cache"))
    jax.jit(lambda x: x - 1)(np.float32(1))  # a compile: JAX opens the cache it was given, if any
    before = jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs
    try:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        use_compilation_cache(str(tmp_path / "cache"))
        jax.jit(lambda x: x * 3 + 7)(np.arange(5.0))  # a program new to this process
        assert [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]
    finally:
        jax.config.update("jax_compilation_cache_dir", before[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])
        compilation_cache.reset_cache()
