"""The translation experiment end to end on the real Multi30k data, with the `test` configs."""

import json

import jax
import numpy as np
import pytest

from lm.data import translation
from lm.train.loop import train


@pytest.mark.parametrize("config_name", ["translate_rnn", "translate_transformer"])
def test_translation_trains_on_bucketed_batches(tmp_path, data_dir, config_name):
    module = __import__(f"configs.{config_name}", fromlist=["get_config"])
    config = module.get_config("test")
    summary = train(config, str(tmp_path), devices=jax.devices()[:1])
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    eval_loss = {r["step"]: r["eval_loss"] for r in records if "eval_loss" in r}
    assert eval_loss[0] > np.log(500) - 0.5  # about chance over the 500-piece vocabulary at the start
    assert summary["eval_loss"] < eval_loss[0] - 0.3, eval_loss
    assert 0 < summary["eval_accuracy"] < 1 and summary["eval_cross_entropy"] < summary["eval_loss"]
    source, target = translation.load_tokenizers(tmp_path)  # saved with the run: translating needs no data
    assert source.vocab_size == target.vocab_size == 500
    assert "Eine Gruppe von Männern lädt Baumwolle" in (tmp_path / "samples.txt").read_text()  # val sentence 0
