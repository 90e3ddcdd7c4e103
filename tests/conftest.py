"""Test set-up: 8 fake CPU devices (set before jax is imported) and the real data directory."""

import fcntl
import hashlib
import json
import os
import pathlib
import shutil
import sys
import tempfile

# XLA's CPU backend without LLVM's expensive optimisation passes and with its older loop emitters for
# fusions: the suite's programs are tiny, so compiling them is most of its time. The first two flags
# halve it; the third takes a further fifth off the suite (same operations, same results).
FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                      "--xla_cpu_use_fusion_emitters=false")
os.environ["XLA_FLAGS"] = " ".join(
    (os.environ.get("XLA_FLAGS", ""), FAST_COMPILE_FLAGS, "--xla_force_host_platform_device_count=8"))
os.environ["LM_OFFLINE"] = "1"  # tests never download: missing data must fail with a message

import pytest  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def pytest_configure(config):
    """One persistent compilation cache for the whole run, shared by the xdist workers and the CLI
    subprocesses (they inherit the environment): many tests compile the same programs (the test
    configs' train steps), and compiling is most of the suite's time. Set up before jax is imported."""
    if hasattr(config, "workerinput") or "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return  # an xdist worker (it inherits the controller's), or the caller chose a cache
    config.jax_cache_dir = tempfile.mkdtemp(prefix="lm-tests-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = config.jax_cache_dir
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true",
                     help="also run the integration tests marked slow (the default tier leaves them out)")


def pytest_collection_modifyitems(config, items):
    """Two tiers: the default run skips the tests marked slow (integration tests: training runs,
    subprocesses, notebooks), each reported as skipped with how to run it; --runslow runs them too,
    first, so that the xdist workers (pyproject.toml runs them with --dist worksteal) end on short tests
    and finish together."""
    if not config.getoption("--runslow"):
        skip = pytest.mark.skip(reason="slow: run with --runslow")
        for item in items:
            if item.get_closest_marker("slow"):
                item.add_marker(skip)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_unconfigure(config):
    if hasattr(config, "jax_cache_dir"):
        shutil.rmtree(config.jax_cache_dir, ignore_errors=True)


def subprocess_env(devices: int = 1, **changes: str | None) -> dict[str, str]:
    """The environment for a command-line subprocess: this one's, with `devices` CPU devices (1, as a
    user has, unless a test wants a mesh) and the fast-compile flags, then changes (None: removed)."""
    flags = FAST_COMPILE_FLAGS + (f" --xla_force_host_platform_device_count={devices}" if devices > 1 else "")
    env = {**os.environ, "XLA_FLAGS": flags, **changes}
    return {k: v for k, v in env.items() if v is not None}


def keep_first_eval_pairs(patch: pytest.MonkeyPatch, count: int) -> None:
    """While patch is active, lm.data.translation.load_pairs returns only the first `count` pairs of every
    split but train (which data.max_train_pairs cuts), for tests whose subject is not the scores."""
    from lm.data import translation

    load_pairs = translation.load_pairs

    def first_pairs(split, *langs):
        sources, targets = load_pairs(split, *langs)
        return (sources, targets) if split == "train" else (sources[:count], targets[:count])

    patch.setattr(translation, "load_pairs", first_pairs)


@pytest.fixture(scope="session")
def data_dir() -> pathlib.Path:
    """$LM_DATA_DIR, which must hold tinyshakespeare/input.txt (CI sets it to ../shared/data)."""
    path = pathlib.Path(os.environ.get("LM_DATA_DIR", REPO.parent / "shared" / "data"))
    if not (path / "tinyshakespeare" / "input.txt").is_file():
        pytest.fail(f"set LM_DATA_DIR to the data folder: {path}/tinyshakespeare/input.txt not found")
    os.environ["LM_DATA_DIR"] = str(path)
    return path


@pytest.fixture
def test_config():
    from configs.gpt_shakespeare import get_config

    config = get_config("test")
    config.sample.max_new_tokens = 0  # no sample after training: not what these tests check (and a compile)
    return config


def packed_source_overrides(data_dir: pathlib.Path, folder: pathlib.Path) -> dict[str, object]:
    """Config overrides that turn configs/gpt2.py:test into a model of gpt_shakespeare.py:test's size on
    documents packed by document: the first 400 paragraphs of Tiny Shakespeare as folder/documents.jsonl,
    with a byte-level BPE of 300 ids trained on them (folder/tokenizer.json), context 16."""
    from lm.data.bpe import BPETokenizer

    text = (data_dir / "tinyshakespeare" / "input.txt").read_text()
    paragraphs = [paragraph for paragraph in text.split("\n\n") if paragraph.strip()][:400]
    with open(folder / "documents.jsonl", "w") as f:
        f.writelines(json.dumps({"text": paragraph}) + "\n" for paragraph in paragraphs)
    BPETokenizer.train(paragraphs, 300).save(folder / "tokenizer.json")
    return {"data.dataset": "source", "data.source": f"files:{folder}/documents.jsonl", "data.vocab_size": 300,
            "data.tokenizer": str(folder / "tokenizer.json"), "data.context_length": 16,
            "model.compute_dtype": "float32", "model.scan_layers": False, "model.loss_chunk": 0,
            "model.embed_dim": 32, "model.num_heads": 2, "model.num_kv_heads": 2}


def packed_source_config(overrides: dict[str, object]):
    """configs/gpt2.py:test with packed_source_overrides, and no sample after training."""
    from configs.gpt2 import get_config

    config = get_config("test")
    for key, value in overrides.items():
        section, field = key.split(".")
        config[section][field] = value
    config.sample.max_new_tokens = 0
    return config


def shared_folder(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """This pytest run's temporary folder, the same for every xdist worker (each has its own below it)."""
    folder = tmp_path_factory.getbasetemp()
    return folder.parent if "PYTEST_XDIST_WORKER" in os.environ else folder


def train_sentencepiece_once(patch: pytest.MonkeyPatch, folder: pathlib.Path) -> None:
    """While patch is active, lm.data.translation's SentencePiece training (deterministic: one thread, all
    the input) keeps each model it trains in folder, and an identical training later (in any xdist
    worker) reads it instead: several tests build the same translation test config."""
    from lm.data import translation

    train = translation.SentencePieceTokenizer.train.__func__

    def train_or_read(cls, sentences, *args, **kwargs):
        key = hashlib.sha256(repr((list(sentences), args, sorted(kwargs.items()))).encode()).hexdigest()
        path = folder / f"sentencepiece-{key}.model"
        if path.is_file():
            return cls(path.read_bytes())
        tokenizer = train(cls, sentences, *args, **kwargs)
        partial = path.with_suffix(f".{os.getpid()}")
        partial.write_bytes(tokenizer.model_proto)
        os.replace(partial, path)  # whole or absent for a reader in another worker
        return tokenizer

    patch.setattr(translation.SentencePieceTokenizer, "train", classmethod(train_or_read))


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, data_dir):
    """A 40-step run of the test config on one device, shared by the tests that only read it. The first
    xdist worker to need it trains it (under a file lock) in the folder all workers share; the others
    read it from there."""
    import jax

    from configs.gpt_shakespeare import get_config
    from lm.cli.resolve import build_experiment
    from lm.train.loop import train

    config = get_config("test")
    config.train.num_steps = 40
    config.optimizer.decay_steps = 40
    config.eval.context_lengths = (16, 32)  # the training length, and 2x (left out: learned positions)
    shared = shared_folder(tmp_path_factory)
    workdir, summary_file = shared / "trained_run", shared / "trained_run_summary.json"
    with (shared / "trained_run.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not summary_file.is_file():
            summary = train(config, str(workdir), build_experiment, devices=jax.devices()[:1])
            summary_file.write_text(json.dumps(summary))
    return config, workdir, json.loads(summary_file.read_text())
