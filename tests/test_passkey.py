"""Context extension's measures: the synthetic passkey task (lm/eval/passkey.py, `lm eval --tasks=passkey:LENGTH`)
and the val loss by position band (eval.position_bands, experiments/language_model.py)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import language_model
from lm.data.text import CharTokenizer
from lm.errors import UserError
from lm.eval import models, passkey, report, tasks
from lm.eval.scoring import Scorer, target_scores


def characters(text: str) -> list[int]:
    """A character-level tokenizer: each UTF-8 byte one id."""
    return list(text.encode())


def words(text: str) -> list[int]:
    """A coarser tokenizer: each space-separated word one id."""
    return [hash(word) % 1000 for word in text.split(" ")]


@pytest.mark.parametrize("encode", [characters, words])
def test_documents_are_seeded_hide_their_key_and_fill_the_length(encode):
    found = passkey.documents(encode, 300, 9)
    assert found == passkey.documents(encode, 300, 9)  # deterministic
    assert [d.key for d in found] != [d.key for d in passkey.documents(encode, 300, 9, seed=1)]
    assert len({d.key for d in found}) == 9 and all(len(d.key) == 5 and d.key.isdigit() for d in found)
    assert [d.depth for d in found] == pytest.approx(np.linspace(0, 1, 9))
    places = []
    for d in found:
        context, continuation = d.request
        assert continuation == " " + d.key and context.endswith(passkey.QUESTION)
        line = passkey.KEY_LINE.format(key=d.key)
        assert context.count(line) == 1
        places.append(context.index(line) / len(context))
        total = len(encode(context + continuation))
        assert total <= 300  # the most filler that fits: one more sentence would not
        more = passkey.text(context.count(".") - 3 + 1, d.depth, d.key)  # (the key's line has three periods)
        assert len(encode(more + continuation)) > 300
    assert places[0] == 0 and places == sorted(places) and len(set(places)) == 9  # the key from first ...
    assert found[-1].prompt.endswith(passkey.KEY_LINE.format(key=found[-1].key) + " " + passkey.QUESTION)  # to last


def test_names_and_lengths_are_checked_in_one_line():
    chosen = tasks.parse_tasks("passkey:512,passkey:64")
    assert [(t.name, t.kind, t.length) for t in chosen] == [("passkey:512", "passkey", 512),
                                                            ("passkey:64", "passkey", 64)]
    tasks.check_data(chosen)  # synthetic: no file to find
    for bad in ("passkey:", "passkey:0", "passkey:1k"):
        with pytest.raises(UserError, match=f"'{bad}': write passkey:LENGTH"):
            tasks.parse_tasks(bad)
    with pytest.raises(UserError, match="the tasks are .*, and passkey:LENGTH"):
        tasks.parse_tasks("paskey:512")
    with pytest.raises(UserError, match="the key's line and the question alone take 102 tokens, over 50"):
        passkey.documents(characters, 50, 2)
    letters = "".join(sorted(set(passkey.text(5, 0, "") + passkey.QUESTION)))
    assert len(passkey.documents(models.CharacterEncoder(CharTokenizer(letters + "0123456789")), 150, 2)) == 2
    with pytest.raises(UserError, match="the run's characters lack the digits 012456789: it cannot write a pass key"):
        passkey.documents(models.CharacterEncoder(CharTokenizer(letters + "3")), 150, 2)


def oracle_scorer(right: bool, max_length: int = 256) -> Scorer:
    """A scorer whose model's argmax is always the target (right) or always id 0 (never a target here)."""

    def apply(params, ids, positions, targets):
        logits = jax.nn.one_hot(targets if right else jnp.zeros_like(targets), 256) * 10.0
        return target_scores(logits, targets)

    return Scorer(apply, jnp.zeros(()), characters, max_length, prefix_token_id=10, batch_size=4, num_buckets=2)


def test_retrieval_is_scored_by_the_greedy_continuation(capsys):
    right, wrong = (report.evaluate(oracle_scorer(answer), tasks.parse_tasks("passkey:200"), limit=6)[0]
                    for answer in (True, False))
    assert right.documents == 6 and right.metrics["acc"] == 1.0 and wrong.metrics["acc"] == 0.0
    assert right.metrics["acc_depth_0_25"] == 1.0 and right.metrics["acc_depth_75_100"] == 1.0
    table = report.table([right])
    assert re.search(r"passkey:200 \| acc_depth_25_50 +\| 1.0000 \| - ", table)  # one document: no stderr
    responses = [[(0.0, greedy)] for greedy in (True, False, True)]
    found = passkey.documents(characters, 200, 3)
    metrics = passkey.aggregate(found, responses)
    assert metrics["acc"] == pytest.approx(2 / 3) and metrics["acc_depth_25_50"] is None  # depths 0, .5, 1
    assert metrics["acc_depth_50_75"] == 0.0 and metrics["acc_depth_75_100"] == 1.0
    assert re.search(r"passkey:200 \| acc_depth_25_50 +\| - ", report.table([report.TaskResult(
        tasks.parse_tasks("passkey:200")[0], 3, metrics, responses, 0.0)]))


def test_a_length_over_the_models_context_is_one_line():
    with pytest.raises(UserError, match=r"^passkey:300: 300 tokens: the model reads 256 \(its data.context_length\)"):
        report.evaluate(oracle_scorer(True), tasks.parse_tasks("passkey:300"), limit=2)


def test_band_sums_equal_a_direct_computation():
    rng = np.random.default_rng(0)
    cross_entropy, weights = rng.random((3, 10)), (rng.random((3, 10)) > 0.3).astype(float)
    positions = np.tile(np.arange(10), (3, 1))
    bands = language_model.position_bands((4, 7, 10))
    assert bands == [(0, 4), (4, 7), (7, 10)]
    sums = language_model.band_sums(cross_entropy, positions, weights, bands)
    for (a, b), (total, count) in zip(bands, sums, strict=True):
        assert total == pytest.approx(np.sum(cross_entropy[:, a:b] * weights[:, a:b]))
        assert count == np.sum(weights[:, a:b])


def test_band_losses_are_masked_means_over_all_batches_by_model_position(monkeypatch):
    """Two batches: windows (positions 0..T-1) and a packed one (positions restart in each document; padding has
    weight 0); each band's loss is the mean over every token at those positions of both."""
    rng = np.random.default_rng(1)
    losses = [rng.random((2, 8)), rng.random((2, 8))]
    packed_positions = np.array([[0, 1, 2, 3, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 0, 0]])
    packed_weights = np.array([[1.0] * 8, [1.0] * 6 + [0.0] * 2])
    batches = [{"inputs": np.zeros((2, 8), np.int32)},
               {"inputs": np.ones((2, 8), np.int32), "positions": packed_positions, "weights": packed_weights}]
    monkeypatch.setattr(language_model, "token_cross_entropy",
                        lambda model, params, batch: losses[int(batch["inputs"][0, 0])])
    bands = [(0, 2), (2, 4), (4, 8)]
    found = language_model.position_band_losses(None, None, batches, bands)
    positions = np.concatenate([np.tile(np.arange(8), (2, 1)), packed_positions]).ravel()
    weights = np.concatenate([np.ones((2, 8)), packed_weights]).ravel()
    values = np.concatenate(losses).ravel()
    for (a, b), loss in zip(bands, found, strict=True):
        inside = (positions >= a) & (positions < b) & (weights > 0)
        assert loss == pytest.approx(values[inside].mean())
    assert np.isnan(language_model.position_band_losses(None, None, batches, [(8, 9)])[0])


@pytest.mark.parametrize("edges", [(0, 128), (256, 128), (128, 128), ("128",), (True,)])
def test_bad_position_bands_are_one_line(edges):
    with pytest.raises(UserError, match=r"eval.position_bands=.*: give the ends of the position bands"):
        language_model.position_bands(edges)


@pytest.mark.slow
def test_band_losses_of_a_rope_model_at_twice_its_length(data_dir, test_config):
    """eval.position_bands on a RoPE model's windows of twice the training length: the bands' losses average to
    the length's val cross-entropy (equal bands, every token a weight of one), and are named by length and band."""
    test_config.model.position = "rope"
    test_config.eval.context_lengths = (32,)
    test_config.eval.position_bands = (16, 32)
    experiment = language_model.build(test_config)
    params = experiment.init(jax.random.key(0))["params"]
    loss = jax.jit(lambda p, b: experiment.loss(p, b, jax.random.key(0), False)[1]["cross_entropy"])

    def evaluate(batches):
        return {"cross_entropy": float(np.mean([loss(params, b) for b in batches]))}

    results = experiment.final_results(params, evaluate, workdir=None)
    assert set(results) == {"val_cross_entropy_ctx32", "val_cross_entropy_ctx32_pos0_16",
                            "val_cross_entropy_ctx32_pos16_32"}
    assert np.mean([results["val_cross_entropy_ctx32_pos0_16"], results["val_cross_entropy_ctx32_pos16_32"]]) == \
        pytest.approx(results["val_cross_entropy_ctx32"], rel=1e-5)


@pytest.mark.slow
def test_the_command_scores_passkey_on_a_model_and_writes_eval_json(tmp_path, monkeypatch, capsys):
    """`lm eval --hf=DIR --tasks=passkey:128,passkey:200 --limit=4` on a tiny GPT-2 folder (context 256): its rows and
    eval.json; a LENGTH over its context is one line naming it."""
    import json
    import pathlib

    from lm.cli.eval import score_tasks

    folder = pathlib.Path(__file__).parent / "fixtures" / "eval" / "gpt2"
    monkeypatch.chdir(tmp_path)
    results = score_tasks("passkey:128,passkey:200", 4, None, str(folder), batch_size=4)
    assert [(r.task.name, r.documents) for r in results] == [("passkey:128", 4), ("passkey:200", 4)]
    assert re.search(r"passkey:200 \| acc_depth_75_100 \| \d\.\d{4} \| - ", capsys.readouterr().out)
    written = json.loads((tmp_path / "eval" / "gpt2" / "eval.json").read_text())["tasks"]
    assert written["passkey:128"]["documents"] == 4 and 0 <= written["passkey:128"]["acc"] <= 1
    with pytest.raises(UserError, match=r"^passkey:300: 300 tokens: the model reads 256 "):
        score_tasks("passkey:300", 4, None, str(folder), out=str(tmp_path / "over"))
    assert not (tmp_path / "over").exists()
