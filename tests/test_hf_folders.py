"""Hugging Face folders without retyping (docs/evaluation.md, docs/huggingface.md): a run takes its model from a
folder's config.json (init_from_config), an import run of 0 steps saves the folder's weights as its checkpoint,
`lm export` writes the run's BPE tokenizer beside the weights, and `lm sample --hf` / `lm eval --hf` read a folder
directly: the run, the folder it came from and the folder it exports to give the same log-likelihoods and the same
greedy sample. On tests/fixtures/eval/gpt2, the GPT-2 fixture with a 131-id BPE."""

import json
import pathlib

import jax
import numpy as np
import pytest
from test_cli import assert_user_error, main_in_process

from configs.base import language_model
from lm.cli import sample as sample_cli
from lm.cli.eval import score_tasks
from lm.cli.export import export_run
from lm.cli.resolve import build_experiment
from lm.cli.sample import folder_sampler
from lm.errors import UserError
from lm.train.init_from import model_from_source
from lm.train.loop import train

FOLDER = pathlib.Path(__file__).parent / "fixtures" / "eval" / "gpt2"


def import_config(tmp_path: pathlib.Path):
    """The base token-file config (4 layers, 128 wide, context 1024, GPT-2's vocabulary) importing FOLDER with
    init_from_config, for 0 steps, on token files of the folder's tokenizer."""
    ids = np.arange(2000, dtype=np.uint16) % 131
    for split in ("train", "val"):
        ids.tofile(tmp_path / f"{split}.bin")
    config = language_model("token_file")
    config.data.update(train_file=str(tmp_path / "train.bin"), val_file=str(tmp_path / "val.bin"),
                       tokenizer=str(FOLDER / "tokenizer.json"))
    config.update(init_from=f"hf:{FOLDER}", init_from_config=True)
    config.train.update(num_steps=0, batch_size=2)
    config.eval.every = 0
    config.sample.max_new_tokens = 0
    return config


def test_init_from_config_takes_the_model_from_config_json(tmp_path, capsys):
    config = import_config(tmp_path)
    filled = model_from_source(config)
    assert (filled.model.num_layers, filled.model.embed_dim, filled.model.mlp_hidden_dim) == (2, 32, 48)
    assert (filled.data.vocab_size, filled.data.context_length) == (131, 256)  # lowered to n_positions
    assert "sets data.context_length=256 (was 1024), data.vocab_size=131 (was 0)" in capsys.readouterr().out
    assert model_from_source(filled).to_dict() == filled.to_dict()
    config.init_from = "runs/baby"
    with pytest.raises(UserError, match="init_from_config=True takes the model from a Hugging Face folder's "
                                        "config.json: give init_from=hf:DIR"):
        model_from_source(config)


@pytest.mark.slow
def test_an_import_run_of_no_steps_exports_a_folder_that_scores_and_samples_as_the_run(data_dir, tmp_path, capsys):
    run, exported = tmp_path / "run", tmp_path / "exported"
    train(import_config(tmp_path), str(run), build_experiment, devices=jax.devices()[:1])
    assert [p.name for p in (run / "checkpoints").iterdir() if p.name.isdigit()] == ["0"]
    export_run(run, exported, "float32")
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in exported.iterdir()}
    settings = json.loads((exported / "tokenizer_config.json").read_text())
    assert settings["eos_token"] == "<|endoftext|>" and settings["model_max_length"] == 256

    # the run is scored on its mesh (data over the suite's 8 CPU devices: batches of 8 split over them), the folder
    # on one device
    ours, theirs = (score_tasks("arc_easy", 2, workdir, folder, out=str(tmp_path / "scored"), batch_size=8)[0]
                    for workdir, folder in ((str(run), None), (None, str(exported))))
    np.testing.assert_allclose(np.array(theirs.responses)[..., 0], np.array(ours.responses)[..., 0], rtol=1e-6,
                               atol=1e-5)
    assert theirs.metrics == ours.metrics

    sampled = folder_sampler(str(exported))("ROMEO:", 6, 0.0, 0)  # greedy
    assert folder_sampler(str(FOLDER))("ROMEO:", 6, 0.0, 0) == sampled and len(sampled) > len("ROMEO:")
    capsys.readouterr()
    assert_user_error(main_in_process(capsys, sample_cli, f"--workdir={run}", f"--hf={exported}"),
                      "give one of --workdir=DIR (a run folder written by lm train) and --hf=DIR")
