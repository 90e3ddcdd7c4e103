"""lm as lm-evaluation-harness's model (lm/eval/harness.py), tested without lm-eval (an optional dependency the suite
never imports): the adapter's methods on request-like objects (the `.args` tuples the harness passes) against
lm/eval's scoring and the harness's recorded log-likelihoods (tests/fixtures/eval/gpt2.json); generate_until against
greedy decoding by whole forward passes, with the cut from the left, stop strings and the end-of-text id; the
generation options as the harness normalises them; and the one line when lm-eval is missing."""

import json
import pathlib
import sys
import types

import jax
import numpy as np
import pytest

from lm.cli.eval import harness_tasks, load_model
from lm.errors import UserError
from lm.eval import tasks
from lm.eval.harness import INSTALL, Generation, HarnessModel, cut_at_stops, generation_options
from lm.eval.scoring import loglikelihoods, rolling_loglikelihoods

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "eval"


@pytest.fixture(scope="module")
def model() -> HarnessModel:
    """The GPT-2 eval fixture (256 positions, a 131-id BPE whose <|endoftext|> is id 0) as `lm eval --hf` loads it."""
    return load_model(None, str(FIXTURES / "gpt2"), None, None, 8)[1]


def requests(*args: tuple) -> list:
    return [types.SimpleNamespace(args=arguments) for arguments in args]


def test_loglikelihoods_are_lm_evals_and_equal_the_harness(model, data_dir):
    lambada = tasks.documents(tasks.TASKS["lambada_openai"], 2)  # the fixture's first two documents
    recorded = json.loads((FIXTURES / "gpt2.json").read_text())["tasks"]["lambada_openai"]["responses"][:2]
    found = model.loglikelihood(requests(*lambada))
    assert found == loglikelihoods(model.scorer, lambada)
    np.testing.assert_allclose([ll for ll, _ in found], [r[0][0] for r in recorded], rtol=1e-6, atol=1e-4)
    assert [greedy for _, greedy in found] == [r[0][1] for r in recorded]
    text = (data_dir / "tinyshakespeare" / "input.txt").read_text()[:1500]  # several windows of 256 tokens
    assert model.loglikelihood_rolling(requests((text,))) == rolling_loglikelihoods(model.scorer, [text])


def greedy_ids(model: HarnessModel, ids: list[int], count: int) -> list[int]:
    """count greedy ids after ids, each from a whole forward pass (no cache) of a 256-long buffer."""
    forward = jax.jit(lambda params, buffer: model.model.apply({"params": params}, buffer))
    buffer = np.zeros((1, model.scorer.max_length), np.int32)
    buffer[0, :len(ids)] = ids
    for length in range(len(ids), len(ids) + count):
        buffer[0, length] = int(np.argmax(forward(model.scorer.params, buffer)[0, length - 1]))
    return buffer[0, len(ids):len(ids) + count].tolist()


def test_generate_until_decodes_greedily_from_the_context_cut_from_the_left(model, data_dir):
    """A LAMBADA passage of 326 tokens, cut to the last 256 - 8; 8 new tokens, then the stop strings; a model whose
    end-of-text id is its first new token generates nothing."""
    context, _ = tasks.documents(tasks.TASKS["lambada_openai"], 3)[2]
    ids = model.scorer.encode(context)
    assert len(ids) > model.scorer.max_length
    expected = greedy_ids(model, ids[-(model.scorer.max_length - 8):], 8)
    assert 0 not in expected  # (no end-of-text id among them: nothing cut)
    text = model.tokenizer.decode(expected)
    stop = text[2:4]
    found = model.generate_until(requests((context, {"until": [], "max_gen_toks": 8}),
                                          (context, {"until": ["@@", stop], "max_new_tokens": 8, "do_sample": False})))
    assert found == [text, text.split(stop)[0]] and len(found[1]) >= 2
    stopped = HarnessModel(model.scorer, model.model, model.tokenizer, end_of_text_id=expected[0])
    assert stopped.generate_until(requests((context, {"max_gen_toks": 8}))) == [""]
    with pytest.raises(UserError, match="a task asks for 256 new tokens, and the model reads 256: it leaves no room"):
        model.generate_until(requests((context, {"max_gen_toks": 256})))


def test_generation_options_as_the_harness_normalises_them():
    assert generation_options({"until": "x"}, "<|endoftext|>") == Generation(("x", "<|endoftext|>"), 256, 0.0, 0, 1.0)
    assert generation_options({"until": ["a"], "max_tokens": 9, "max_new_tokens": 5}, None).max_new_tokens == 5
    assert generation_options({"do_sample": True, "temperature": 0.7, "top_k": 5, "top_p": 0.9}, None) == \
        Generation((), 256, 0.7, 5, 0.9)
    assert generation_options({"temperature": 0.5}, None).temperature == 0.5  # do_sample unset: sampled
    assert generation_options({"do_sample": False, "temperature": 0.5}, None).temperature == 0.0
    assert cut_at_stops("abcXdefYg", ["Y", "", "X"]) == "abc"


def test_without_lm_eval_the_harness_is_one_line_saying_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # (an import of it fails, installed or not)
    with pytest.raises(UserError, match="^" + INSTALL.replace("(", r"\(").replace(")", r"\)") + "$"):
        harness_tasks("arc_easy", 8, None, "/nonexistent/folder")  # before the model is looked for
    assert "\n" not in INSTALL and "pip install lm-eval" in INSTALL
