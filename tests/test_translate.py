"""`lm translate`: translations and attention heat maps from a run folder alone, and its one-line errors."""

import json
import subprocess
import sys

import flax.linen as nn
import jax
import matplotlib.image
import numpy as np
import pytest
from conftest import REPO, keep_first_eval_pairs, subprocess_env

from experiments.translation import Translation
from lm import plots
from lm.cli import parse_flags
from lm.cli import translate as translate_cli
from lm.cli.resolve import build_experiment, load_run
from lm.data import translation
from lm.errors import UserError

SENTENCE = "Zwei Hunde spielen im Schnee."
GERMAN = [SENTENCE, "Ein Mann fährt Fahrrad.", "Zwei Männer spielen Fußball im Park."]
ENGLISH = ["Two dogs play in the snow.", "A man rides a bike.", "Two men play soccer in the park."]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def cli(*args: str) -> None:
    """`lm translate args`, in this process (as app.run would: parse the flags, then main)."""
    translate_cli.flags.FLAGS.unparse_flags()  # no flag value left over from an earlier call
    translate_cli.main(parse_flags(["lm translate", *args]))


def assert_one_line_error(capsys, excinfo, *fragments) -> str:
    assert excinfo.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def tiny_experiment(architecture: str, attention: str = "bahdanau", num_layers: int = 1):
    """An untrained test-config model with word vocabularies of three sentence pairs: no data, no training.
    Returns (experiment, init function of an rng)."""
    module = __import__(f"configs.translate_{architecture}", fromlist=["get_config"])
    config = module.get_config("test")
    if architecture == "rnn":
        config.model.attention = attention
    else:
        config.model.num_layers = num_layers
    config.data.buckets = (8, 16)  # at most 16 output tokens
    tokenizers = translation.WordTokenizer.fit(GERMAN, 1), translation.WordTokenizer.fit(ENGLISH, 1)
    experiment = Translation(config, *tokenizers)
    return experiment, lambda rng: nn.unbox(jax.jit(experiment.init)(rng))["params"]


def assert_distributions(source: list[str], output: list[str], maps: dict[str, np.ndarray]) -> None:
    """Every map (T, S): non-negative rows over the source that sum to 1, and not a uniform stand-in."""
    for weights in maps.values():
        assert weights.shape == (len(output), len(source))
        assert np.all(weights >= 0)
        np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-5)
        assert not np.allclose(weights, 1 / len(source), atol=1e-4)


@pytest.fixture(scope="module")
def rnn_run(tmp_path_factory, data_dir):
    """A 2-step run of the Bahdanau test config on the first Multi30k lines (seconds, not minutes)."""
    from configs.translate_rnn import get_config
    from lm.train.loop import train

    config = get_config("test")
    config.data.update(buckets=(16, 32), max_train_pairs=200)
    config.train.num_steps = 2
    config.eval.every = 1000
    if "beam_sizes" in config.eval:
        config.eval.beam_sizes = (1,)
    workdir = tmp_path_factory.mktemp("mt_rnn")
    with pytest.MonkeyPatch.context() as patch:
        keep_first_eval_pairs(patch, 8)
        train(config, str(workdir), build_experiment, devices=jax.devices()[:1])
    return workdir


@pytest.fixture
def no_data(monkeypatch):
    """Translating must read the run folder only: any attempt to read Multi30k fails the test."""
    monkeypatch.delenv("LM_DATA_DIR", raising=False)

    def refuse(*args):
        raise AssertionError("lm translate read the corpus")

    monkeypatch.setattr(translation, "load_pairs", refuse)


@pytest.mark.slow
def test_cli_translates_from_the_run_folder(rnn_run, no_data, monkeypatch, capsys, tmp_path):
    results = json.loads((rnn_run / "results.json").read_text())  # the trainer scored the test split too
    assert results["step"] == 2 and 0 <= results["test_bleu_beam1"] <= 100
    experiment, params = load_run(rnn_run, "translate")
    calls = []  # the CLI gets this same loaded run (saves compiling each search twice)
    monkeypatch.setattr(translate_cli, "load_run", lambda *args: calls.append(args) or (experiment, params))
    sentences = [SENTENCE, "Ein Mann fährt Fahrrad."]
    cli(f"--workdir={rnn_run}", *sentences)  # beam search, beam_size 4 by default
    lines = capsys.readouterr().out.splitlines()
    assert lines == experiment.translate(params, sentences, 4, 0.6)
    assert len(lines) == 2 and all(line.strip() for line in lines)

    png = tmp_path / "attention.png"
    cli(f"--workdir={rnn_run}", SENTENCE, f"--attention_png={png}", "--beam_size=1")
    printed = capsys.readouterr()
    lines = printed.out.splitlines()
    assert lines == experiment.translate(params, [SENTENCE], 1)
    assert printed.err.splitlines()[-1] == f"done: the attention map in {png}"
    assert calls == [(rnn_run, "translate")] * 2
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(png)  # (height, width, RGBA)
    source, output, maps = experiment.attention_maps(params, SENTENCE, 1, 0.6)
    assert list(maps) == ["bahdanau attention"] and source[-1] == "<eos>"
    assert source == experiment.source_tokenizer.pieces(SENTENCE) + ["<eos>"]  # SentencePiece pieces
    assert experiment.target_tokenizer.decode(
        [experiment.target_tokenizer._sp.piece_to_id(piece) for piece in output]) == lines[0]
    assert_distributions(source, output, maps)
    width, height = plots.save_attention_heatmap(tmp_path / "again.png", source, output, maps)
    assert image.shape == (height, width, 4) and image[..., :3].std() > 0.05
    np.testing.assert_array_equal(image, matplotlib.image.imread(tmp_path / "again.png"))  # the same map


@pytest.mark.parametrize(
    "architecture, attention, titles",
    [
        ("rnn", "luong_general", ["luong_general attention"]),
        ("transformer", "", ["decoder layer 1", "decoder layer 2"]),
    ],
)
def test_attention_maps_are_distributions_over_the_source(architecture, attention, titles):
    experiment, init = tiny_experiment(architecture, attention, num_layers=2)
    params = init(jax.random.key(0))
    source, output, maps = experiment.attention_maps(params, SENTENCE, beam_size=1, length_penalty=0.6)
    assert source == ["zwei", "hunde", "spielen", "im", "schnee", ".", "<eos>"]
    output_ids = [experiment.target_tokenizer.tokens.index(piece) for piece in output]
    assert experiment.target_tokenizer.decode(output_ids) == experiment.translate(params, [SENTENCE], 1)[0]
    assert list(maps) == titles
    assert_distributions(source, output, maps)
    if len(maps) > 1:
        assert not np.allclose(*maps.values())  # each layer's own cross-attention


def test_heatmap_has_a_panel_per_map(tmp_path):
    source, output = ["a", "b", "<eos>"], ["x", "y", "z", "<eos>"]
    maps = {f"decoder layer {i}": np.full((4, 3), 1 / 3) for i in (1, 2, 3)}
    one = plots.save_attention_heatmap(tmp_path / "one.png", source, output, dict(list(maps.items())[:1]))
    three = plots.save_attention_heatmap(tmp_path / "three.png", source, output, maps)
    assert three[0] > one[0] and three[1] == one[1]
    assert matplotlib.image.imread(tmp_path / "three.png").shape == (three[1], three[0], 4)
    with pytest.raises(ValueError, match="shape"):
        plots.save_attention_heatmap(tmp_path / "bad.png", source, output, {"layer": np.ones((3, 4))})


def test_no_attention_model_has_no_attention_png(monkeypatch, capsys, tmp_path):
    experiment, _ = tiny_experiment("rnn", "none")
    params = None  # refused before the parameters are looked at
    with pytest.raises(UserError, match="no attention"):
        experiment.attention_maps(params, SENTENCE, 1, 0.6)
    monkeypatch.setattr(translate_cli, "load_run", lambda workdir, name: (experiment, params))
    png = tmp_path / "attention.png"
    with pytest.raises(SystemExit) as excinfo:
        cli(f"--workdir={tmp_path}", SENTENCE, f"--attention_png={png}")
    assert_one_line_error(capsys, excinfo, "no attention")
    assert not png.exists() and capsys.readouterr().out == ""  # refused before any translation is printed


@pytest.mark.parametrize(
    "args, fragment",
    [
        ([SENTENCE, "Ein Mann fährt Fahrrad.", "--attention_png=a.png"], "exactly one sentence"),
        (["--attention_png=a.png"], "sentences to translate"),
        ([SENTENCE, "--beam_size=0"], "--beam_size=0"),
        ([SENTENCE, "--attention_png=no/such/folder/a.png"], "no/such/folder"),
    ],
)
def test_bad_arguments_are_refused_before_loading(tmp_path, monkeypatch, capsys, args, fragment):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(translate_cli, "load_run", lambda *a: pytest.fail("loaded the run"))
    with pytest.raises(SystemExit) as excinfo:
        cli(f"--workdir={tmp_path}", *args)
    assert_one_line_error(capsys, excinfo, fragment)
    assert not (tmp_path / "a.png").exists()


def test_workdir_without_a_checkpoint(tmp_path, capsys):
    """A run folder as `lm train` leaves it before its first checkpoint: config.json and the tokenizers."""
    from configs.translate_rnn import get_config

    workdir = tmp_path / "run"
    config = get_config("test")
    config.data.tokenizer = "word"
    workdir.mkdir()
    (workdir / "config.json").write_text(config.to_json_best_effort())
    translation.save_tokenizers(workdir, *translation.build_tokenizers("word", ["ein Hund"], ["a dog"], min_freq=1))
    with pytest.raises(SystemExit) as excinfo:
        cli(f"--workdir={workdir}", SENTENCE)
    assert_one_line_error(capsys, excinfo, "no checkpoint")


def test_workdir_without_a_run_as_a_command(tmp_path):
    result = subprocess.run([sys.executable, "-m", "lm", "translate", f"--workdir={tmp_path}", SENTENCE], cwd=REPO,
                            env=subprocess_env(LM_DATA_DIR=None, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "config.json" in lines[0], result.stderr[-2000:]
    assert result.stdout == ""
