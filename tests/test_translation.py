"""The translation experiment on the real Multi30k data: end to end with the `test` configs
(both tokenizers, both directions), a tiny model overfitting 32 pairs, token-weighted eval."""

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import shared_folder, train_sentencepiece_once

from experiments.translation import Translation, build
from lm import progress
from lm.cli.resolve import build_experiment
from lm.data import translation
from lm.errors import UserError
from lm.train.loop import train
from lm.train.metrics import mean_metrics


def get_config(name: str, variant: str = "test"):
    return __import__(f"configs.{name}", fromlist=["get_config"]).get_config(variant)


@pytest.mark.slow
@pytest.mark.parametrize(
    "config_name, overrides, beam_sizes",
    [  # (the RNN with sentencepiece trains through the trainer in test_translate.py's rnn_run, and learns in
        # test_seq2seq.py's test_bahdanau_overfits_reversal)
        ("translate_transformer", {"tokenizer": "word", "min_freq": 20, "source_lang": "en", "target_lang": "de"},
         (2,)),
    ],
)
def test_translation_trains_and_scores_the_test_split(tmp_path, tmp_path_factory, data_dir, monkeypatch, config_name,
                                                      overrides, beam_sizes):
    train_sentencepiece_once(monkeypatch, shared_folder(tmp_path_factory))
    config = get_config(config_name)
    config.data.update(overrides)
    config.eval.beam_sizes = beam_sizes  # one decoding of the 1000 test sentences each
    summary = train(config, str(tmp_path), build_experiment, devices=jax.devices()[:1])
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    eval_loss = {r["step"]: r["eval_loss"] for r in records if "eval_loss" in r}
    source, target = translation.load_tokenizers(tmp_path)  # saved with the run: translating needs no data
    assert eval_loss[0] > np.log(target.vocab_size) - 0.5  # about chance at the start
    assert summary["eval_loss"] < eval_loss[0] - 0.3, eval_loss
    assert 0 < summary["eval_accuracy"] < 1 and summary["eval_cross_entropy"] < summary["eval_loss"]
    first_val_source = {"de": "Eine Gruppe von Männern lädt Baumwolle", "en": "A group of men are loading cotton"}
    assert first_val_source[config.data.source_lang] in (tmp_path / "samples.txt").read_text()

    results = json.loads((tmp_path / "results.json").read_text())
    assert results["step"] == config.train.num_steps
    assert results["test_perplexity"] == pytest.approx(np.exp(results["test_cross_entropy"]))
    for beam_size in config.eval.beam_sizes:
        assert 0 <= results[f"test_bleu_beam{beam_size}"] <= 100
        assert 0 <= results[f"test_bleu_lowercase_tokenized_beam{beam_size}"] <= 100
        lines = (tmp_path / "translations" / f"test_2016_flickr.beam{beam_size}.txt").read_text().splitlines()
        assert len(lines) == 1000  # one per test sentence, in order
    # A rerun of the finished run does nothing (it reads no data), and keeps the results.
    monkeypatch.setattr(translation, "load_pairs", lambda *args: pytest.fail("the finished run read the corpus"))
    assert train(config, str(tmp_path), build_experiment, devices=jax.devices()[:1]) == {"step": config.train.num_steps}
    assert json.loads((tmp_path / "results.json").read_text()) == results


@pytest.fixture(scope="module")
def rnn_experiment(data_dir, tmp_path_factory) -> Translation:
    """The RNN test config's experiment: sentencepiece (500 pieces) fitted on the train split."""
    with pytest.MonkeyPatch.context() as patch:
        train_sentencepiece_once(patch, shared_folder(tmp_path_factory))
        return build(get_config("translate_rnn"))


def short_pairs(experiment: Translation, count: int, length: int) -> translation.Batch:
    """The first `count` training pairs that fit `length` tokens, as one batch."""
    sources, targets = experiment.splits["train"]
    rows = np.flatnonzero(translation.needed_lengths(sources, targets) <= length)[:count]
    return translation.make_batch(sources, targets, rows, length)


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["transformer"])  # (the RNN learns in test_seq2seq.py's reversal task)
def test_tiny_model_overfits_32_pairs_and_greedy_decodes_them(rnn_experiment, architecture):
    if architecture == "rnn":
        config = get_config("translate_rnn")
        config.model.update(embed_dim=64, hidden_dim=128)
    else:
        config = get_config("translate_transformer")
        config.model.update(num_layers=2, embed_dim=64, num_heads=4, num_kv_heads=4)
    config.train.label_smoothing = 0.0
    experiment = Translation(config, rnn_experiment.source_tokenizer, rnn_experiment.target_tokenizer)
    batch = short_pairs(rnn_experiment, count=32, length=16)
    params = nn.unbox(experiment.init(jax.random.key(0)))["params"]
    optimizer = optax.adam(3e-3)

    @jax.jit
    def step(params, opt_state):
        grads, metrics = jax.grad(lambda p: experiment.loss(p, batch, jax.random.key(0), False), has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, metrics

    opt_state = optimizer.init(params)
    for i in range(300):
        params, opt_state, metrics = step(params, opt_state)
        if i % 10 == 9 and metrics["accuracy"] == 1.0:  # memorised: the decoding below is the real check
            break
    assert metrics["accuracy"] == 1.0, metrics

    sources = [experiment.source_tokenizer.decode(row) for row in batch["source"]]
    references = [experiment.target_tokenizer.decode(row) for row in batch["targets"]]
    assert experiment.translate(params, sources) == references


@pytest.mark.slow
def test_eval_metrics_are_token_weighted(rnn_experiment):
    """Batches with few real tokens count less: the eval mean is the mean over all tokens."""
    experiment = rnn_experiment
    params = nn.unbox(experiment.init(jax.random.key(0)))["params"]
    batches = [short_pairs(experiment, count=4, length=16), short_pairs(experiment, count=64, length=32)]
    eval_metrics = jax.jit(lambda p, b: experiment.loss(p, b, jax.random.key(0), False)[1])
    outputs = [(eval_metrics(params, b), experiment.eval_weight(b)) for b in batches]
    weighted = mean_metrics([m for m, _ in outputs], [w for _, w in outputs])

    per_token = []
    logits_of = jax.jit(lambda p, b: experiment.model.apply({"params": p}, b["source"], b["source_mask"],
                                                            b["decoder_inputs"]))
    for b in batches:
        logits = logits_of(params, b)
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.asarray(b["targets"]))
        per_token.append(np.asarray(losses)[b["target_mask"] > 0])
    assert [float(w) for _, w in outputs] == [len(t) for t in per_token]
    assert weighted["cross_entropy"] == pytest.approx(np.concatenate(per_token).mean(), rel=1e-5)
    assert weighted["cross_entropy"] != pytest.approx(np.mean([t.mean() for t in per_token]), rel=1e-3)


def test_decoding_in_chunks_prints_its_progress(rnn_experiment, monkeypatch, capsys):
    """5 sentences in chunks of 2 (the last one padded): a progress line after each chunk but the last
    (lm.progress, every 0 s here)."""
    config = rnn_experiment.config.copy_and_resolve_references()
    config.model.update(embed_dim=16, hidden_dim=16)
    config.eval.batch_size = 2
    experiment = Translation(config, rnn_experiment.source_tokenizer, rnn_experiment.target_tokenizer)
    params = nn.unbox(experiment.init(jax.random.key(0)))["params"]
    sentences = [rnn_experiment.source_tokenizer.decode(ids) for ids in rnn_experiment.splits["train"][0][:5]]
    monkeypatch.setattr(progress, "PROGRESS_SECONDS", 0.0)
    ids = experiment.translate_ids(params, sentences)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" | ")[0] for line in lines] == ["decoding 5 sentences (beam 1): 1 of 3",
                                                        "decoding 5 sentences (beam 1): 2 of 3"]
    assert lines[1].split(" | ")[1].endswith(" sentences/s") and ids.shape[0] == 5


def test_max_train_pairs_keeps_the_first_pairs_and_rejects_a_negative_count(rnn_experiment):
    """The test variants train on the first 5000 pairs (data.max_train_pairs), the eval splits whole."""
    sources, _ = rnn_experiment.splits["train"]
    first = translation.load_pairs("train", "de", "en")[0][:5000]
    assert len(sources) == 5000
    assert rnn_experiment.source_tokenizer.decode(sources[-1]) == rnn_experiment.source_tokenizer.decode(
        rnn_experiment.source_tokenizer.encode(first[-1]))
    assert len(rnn_experiment.splits["val"][0]) == 1014
    config = get_config("translate_rnn")
    config.data.max_train_pairs = -1
    with pytest.raises(UserError, match="data.max_train_pairs=-1: give a count of pairs, or 0 for all"):
        build(config)
