"""The trainer's shape: evaluators beside the eval loss, every batch shape compiled first."""

import json

import jax
import pytest
from conftest import keep_first_eval_pairs

from lm.cli.resolve import build_experiment
from lm.train.loop import train
from lm.train.setup import build, restore_params


@pytest.mark.slow
def test_an_experiment_evaluator_runs_at_its_steps_and_every_bucket_shape_compiles_first(tmp_path, monkeypatch,
                                                                                          capsys):
    """The translation test config for 10 steps, the eval loss every 5 and the val BLEU evaluator every
    10: val_bleu at steps 0 and 10 beside eval_loss at 0, 5 and 10; the last equals the BLEU of the
    saved params' greedy translations of the val split, recomputed here. The data has two length
    buckets: both train step shapes and the eval shape are compiled together at the start of a run (of
    a resumed segment of the same run here). On the first Multi30k lines (160 training pairs, 16 of each
    eval split): the evaluator and the compile schedule are the subject, not the scores."""
    from configs.translate_transformer import get_config
    from experiments.translation import from_workdir
    from lm.data import translation
    from lm.data.bleu import corpus_bleu

    keep_first_eval_pairs(monkeypatch, 16)
    config = get_config("test")
    config.data.max_train_pairs = 160
    config.train.update(num_steps=10, checkpoint_every=10)
    config.eval.update(every=5, bleu_every=10, beam_sizes=())
    summary = train(config, str(tmp_path), build_experiment, devices=jax.devices()[:1])
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "val_bleu" in r] == [0, 10]
    assert [r["step"] for r in records if "eval_loss" in r] == [0, 5, 10]
    experiment = from_workdir(config, tmp_path)
    sources, references = translation.load_pairs("val", "de", "en")
    assert len(sources) == 16
    bleu = corpus_bleu(experiment.translate(restore_params(config, experiment, tmp_path), sources, 1), references)
    assert summary["val_bleu"] == pytest.approx(bleu, abs=1e-6)

    config.train.num_steps = 12
    capsys.readouterr()
    train(config, str(tmp_path), build_experiment, devices=jax.devices()[:1])
    out = capsys.readouterr().out
    assert "resumed from step 10" in out
    assert out.index("resumed from step 10") < out.index("compiled 3 programs in parallel") < out.index("step     12 |")


def test_build_checks_before_anything_compiles(test_config):
    setup = build(test_config, build_experiment, jax.devices()[:1])
    assert (setup.mesh.size, setup.experiment.units_per_example) == (1, test_config.data.context_length)
