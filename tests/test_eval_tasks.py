"""The zero-shot tasks (lm/eval) against lm-evaluation-harness itself: tests/fixtures/eval/make_fixtures.py ran the
harness's Hugging Face model (torch) on two tiny random folders (GPT-2 and Llama, with a 131-id BPE) over 8 documents
of every task (3 WikiText pages) and recorded every request's log-likelihood and is_greedy and the metrics; lm
scores the same folders on the same documents and must agree: each request's log-likelihood to 1e-4 (or 1e-6 of it,
where float32's spacing is coarser), each WikiText page's (a sum of many windows) to 1e-7 of it, is_greedy and every
accuracy and standard error exactly.
Then the pieces against direct references: the pair tokenisation, the rolling windows, the bucketed batches with
their cut from the left, the task texts, and bad input."""

import dataclasses
import importlib.util
import json
import math
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.base import language_model
from experiments.language_model import from_workdir
from lm import progress
from lm.cli.eval import score_tasks
from lm.errors import UserError
from lm.eval import models, report, scoring, tasks
from lm.eval.scoring import Scorer, encode_pair, gpt_apply, rolling_windows, target_scores, token_loglikelihoods
from lm.hf.files import Folder

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "eval"
TOLERANCE = 1e-4
RELATIVE = 1e-6  # float32 sums of hundreds (HellaSwag, PIQA: -800) are 6e-5 apart at the last bit


@pytest.fixture(scope="session")
def small_data_dir(data_dir, tmp_path_factory) -> pathlib.Path:
    """A small $LM_DATA_DIR holding the documents the fixtures were made on, cut from the real one as
    make_fixtures.py cuts it (no task data is committed)."""
    spec = importlib.util.spec_from_file_location("eval_fixtures", FIXTURES / "make_fixtures.py")
    make_fixtures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_fixtures)
    out = tmp_path_factory.mktemp("eval_data")
    make_fixtures.make_data(out, tmp_path_factory.mktemp("eval_harness_docs"))
    return out


@pytest.fixture
def eval_data(small_data_dir, monkeypatch):
    """$LM_DATA_DIR: the small one of the fixtures' documents."""
    monkeypatch.setenv("LM_DATA_DIR", str(small_data_dir))


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_every_task_scores_as_the_harness_scores_it(name, eval_data):
    folder = str(FIXTURES / name)
    config = models.hf_config(folder, language_model("token_file"))
    experiment = from_workdir(config, None)
    tokenizer, prefix = models.hf_tokenizer(folder)
    params = models.hf_params(folder, config, experiment.init)
    scorer = Scorer(gpt_apply(experiment.model), params, models.encoder(tokenizer),
                    config.data.context_length, prefix, batch_size=8, num_buckets=1,
                    scored_chunk=2048)  # one program to compile: one chunk of 8 x 256 scored positions
    assert (config.data.context_length, prefix) == (256, 0)
    # counted as transformers counts them: the folder's tensors, without lm's padding of the vocabulary
    assert models.parameter_count(params, config.data.vocab_size) == sum(
        math.prod(shape.shape) for shape in Folder(folder, "").abstract().values())
    expected = json.loads((FIXTURES / f"{name}.json").read_text())["tasks"]
    results = report.evaluate(scorer, list(tasks.TASKS.values()))
    assert [r.task.name for r in results] == list(expected)
    for result in results:
        theirs = expected[result.task.name]
        assert result.documents == len(theirs["responses"]) == (3 if result.task.name == "wikitext" else 8)
        if result.task.kind == "rolling":
            np.testing.assert_allclose(result.responses, [r[0] for r in theirs["responses"]], rtol=1e-7, atol=0)
        else:
            for ours, reference in zip(result.responses, theirs["responses"], strict=True):
                np.testing.assert_allclose([ll for ll, _ in ours], [ll for ll, _ in reference], rtol=RELATIVE,
                                           atol=TOLERANCE)
                assert [greedy for _, greedy in ours] == [greedy for _, greedy in reference]
        for metric, value in theirs["metrics"].items():
            if "perplexity" in metric or metric == "bits_per_byte":  # exp of a mean of float32 sums
                if metric.endswith("_stderr"):  # the harness bootstraps LAMBADA's; lm gives none
                    assert result.metrics[metric] is None
                else:
                    np.testing.assert_allclose(result.metrics[metric], value, rtol=1e-5)
            else:
                assert result.metrics[metric] == pytest.approx(value, rel=1e-12, abs=0), metric
        assert set(result.metrics) == {m for m in result.task.metrics} | {f"{m}_stderr" for m in result.task.metrics}


def test_the_command_prints_the_table_and_writes_eval_json(eval_data, tmp_path, monkeypatch, capsys):
    """With --hf: a line saying what model was loaded (its parameters as transformers counts them), and eval.json
    in eval/<the folder's name> of the current folder, not in the model's folder."""
    monkeypatch.chdir(tmp_path)
    results = score_tasks("winogrande", 2, None, str(FIXTURES / "gpt2"), batch_size=4)
    printed = capsys.readouterr().out
    assert printed.startswith(f"--hf={FIXTURES / 'gpt2'}: a GPT2LMHeadModel of 27,456 parameters (2 layers, width "
                              "32, vocabulary 131), context 256, float32\n")
    assert "winogrande | acc    | " in printed and "written: eval/gpt2/eval.json" in printed
    assert printed.splitlines()[-1] == \
        f"done: winogrande acc {results[0].metrics['acc']:.4f}; written: eval/gpt2/eval.json"
    assert "init_from" not in printed and not (FIXTURES / "gpt2" / "tasks").exists()
    written = json.loads((tmp_path / "eval" / "gpt2" / "eval.json").read_text())
    assert written["limit"] == 2 and written["tasks"]["winogrande"]["documents"] == 2
    assert written["tasks"]["winogrande"]["acc"] == results[0].metrics["acc"]


def test_bad_input_is_one_line(eval_data, tmp_path, monkeypatch):
    with pytest.raises(UserError, match=r"unknown task 'helaswag' \(did you mean hellaswag\?\); the tasks are "
                                        r"hellaswag, lambada_openai, arc_easy"):
        score_tasks("helaswag,piqa", None, None, str(FIXTURES / "gpt2"))
    with pytest.raises(UserError, match=r"--tasks=lambada,mmlu: unknown task 'lambada' \(did you mean lambada_openai\? "
                                        r"the harness's lambada is a group of lambada_openai and lambada_standard; lm "
                                        r"scores lambada_openai\), 'mmlu'; the tasks are"):
        tasks.parse_tasks("lambada,mmlu")
    with pytest.raises(UserError, match="give --workdir=RUN .* or --hf=DIR .* not both"):
        score_tasks("piqa", None, "run", str(FIXTURES / "gpt2"))
    monkeypatch.setenv("LM_DATA_DIR", str(tmp_path))
    with pytest.raises(UserError, match=f"data file piqa/valid.jsonl not found \\(looked at: {tmp_path}/piqa"):
        score_tasks("piqa", None, None, str(FIXTURES / "gpt2"))
    with pytest.raises(UserError, match="tokenizer.json not found: the tasks are text"):
        models.hf_tokenizer(str(tmp_path))


def test_a_pair_is_tokenised_whole_and_split_after_the_context():
    """The context's trailing spaces move to the continuation; the continuation is the whole text's ids after the
    context's own count (here 'ab' is one token, so the continuation starts inside it)."""

    def encode(text):  # 'ab' one token (9), every other character its code
        ids, i = [], 0
        while i < len(text):
            ids.append(9 if text[i:i + 2] == "ab" else ord(text[i]))
            i += 2 if text[i:i + 2] == "ab" else 1
        return ids

    assert encode_pair(encode, "xa", "b", 0) == ([ord("x"), ord("a")], [])  # whole = x, ab
    assert encode_pair(encode, "x  ", "y", 0) == ([ord("x")], [32, 32, ord("y")])
    assert encode_pair(encode, "", "xy", 0) == ([0], [ord("x"), ord("y")])


def test_rolling_windows_predict_every_token_once_as_the_harness_windows_do():
    for length, max_length in [(1, 4), (4, 4), (5, 4), (11, 4), (9, 3)]:
        ids = list(range(10, 10 + length))
        windows = rolling_windows(ids, -1, max_length)
        assert [t for _, continuation in windows for t in continuation] == ids
        assert windows[0][0] == [-1]
        for context, continuation in windows[1:]:
            start = ids.index(continuation[0])
            assert context == ids[start - len(context):start]
            assert len(context) == (1 if len(continuation) == max_length else max_length + 1 - len(continuation))


def test_bucketed_batches_equal_a_direct_computation_with_the_cut_from_the_left(monkeypatch, capsys):
    """A bigram model (logits of a token depend on it alone): each request's answer, computed on its own in numpy,
    over requests of several lengths (some longer than the context, cut from the left) in batches of 2. A pass
    longer than lm.progress.PROGRESS_SECONDS (0 s here) prints its progress."""
    rng = np.random.default_rng(0)
    table = rng.normal(size=(7, 7)).astype(np.float32)
    table[3, 5] = 9.0  # after 3, 5 is the argmax: a greedy continuation

    def apply(params, rows, positions, targets):  # positions, targets (N, c): a bigram's logits there
        return target_scores(params[rows.tokens.reshape(-1)[positions]], targets)

    scorer = Scorer(apply, jnp.asarray(table), None, max_length=8, prefix_token_id=0, batch_size=2, num_buckets=2,
                    scored_chunk=2)
    requests = [([1, 2, 3], [5]), ([3], [5, 6]), (list(rng.integers(0, 7, 12)), [4, 4]), ([2] * 5, [3, 5, 1])]
    log_probs = table - np.log(np.exp(table).sum(-1, keepdims=True))
    for (context, continuation), (loglikelihood, greedy) in zip(requests, token_loglikelihoods(scorer, requests),
                                                                strict=True):
        sequence = [*context, *continuation][-9:]
        pairs = list(zip(sequence[:-1], sequence[1:], strict=True))[-len(continuation):]
        assert loglikelihood == pytest.approx(sum(log_probs[a, b] for a, b in pairs), abs=1e-5)
        assert greedy == all(table[a].argmax() == b for a, b in pairs)
    assert token_loglikelihoods(scorer, requests[:2])[0][1] is True
    with pytest.raises(UserError, match="a continuation of 9 tokens after 1 of context: the model reads 8 tokens"):
        token_loglikelihoods(scorer, [([1], [2] * 9)])
    monkeypatch.setattr(progress, "PROGRESS_SECONDS", 0.0)
    capsys.readouterr()
    token_loglikelihoods(scorer, requests, "piqa")
    assert re.fullmatch(r"piqa batches: 1 of 2 \| [\d,.]+ requests/s \| ETA 0:00:0\d\n", capsys.readouterr().out)


def test_task_texts_follow_the_harness(eval_data):
    hellaswag = tasks.documents(tasks.TASKS["hellaswag"], 5)
    assert hellaswag[0].requests[0][0] == "Roof shingle removal: A man is sitting on a roof. He"
    assert hellaswag[0].gold == 3 and all(c.startswith(" ") for _, c in hellaswag[0].requests)
    assert "[" not in hellaswag[4].requests[0][0] and ". " in hellaswag[4].requests[0][0]  # a WikiHow row
    assert tasks.hellaswag_text(" a [title] b  [step] c ") == "a. b  c"  # one pass of "  " -> " ", as the harness
    (winogrande,) = tasks.documents(tasks.TASKS["winogrande"], 1)
    assert winogrande.requests == (("Sarah was a much better surgeon than Maria so Sarah", " always got the easier "
                                    "cases."), ("Sarah was a much better surgeon than Maria so Maria",
                                                " always got the easier cases."))
    assert winogrande.gold == 1
    (lambada,) = tasks.documents(tasks.TASKS["lambada_openai"], 1)
    assert lambada[0].startswith("In my palm is a clear stone") and lambada[1] == " signs"
    (arc,) = tasks.documents(tasks.TASKS["arc_easy"], 1)
    assert arc.requests[0][0].startswith("Question: ") and arc.requests[0][0].endswith("\nAnswer:")
    pages = tasks.documents(tasks.TASKS["wikitext"])
    assert len(pages) == 3 and pages[0].text.startswith(" = Robert <unk> =\n\nRobert <unk> is")
    assert tasks.detokenize_wikitext("a @-@ b , c ( d ) 's") == "a-b, c (d)'s"
    assert tasks.mean_stderr([1.0, 0.0, 0.0, 1.0]) == pytest.approx(np.std([1, 0, 0, 1], ddof=1) / math.sqrt(4))
    assert tasks.mean_stderr([1.0]) is None


@pytest.mark.slow
def test_benchmarks_during_training_score_as_the_harness_does(eval_data, data_dir, tmp_path):
    """eval.benchmarks on a run of the fixtures' GPT-2 (its config, tokenizer and weights; trained on Shakespeare
    paragraphs): one evaluator per task, every eval.every steps, whose metrics on the first N documents are the
    harness's (computed from its recorded responses); a character-level run, or a bad spec, is one line before any
    data is read."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from experiments.language_model import build
    from lm.sharding import make_mesh

    folder = FIXTURES / "gpt2"
    paragraphs = (data_dir / "tinyshakespeare" / "input.txt").read_text().split("\n\n")[:100]
    (tmp_path / "text.jsonl").write_text("".join(json.dumps({"text": p}) + "\n" for p in paragraphs))
    config = models.hf_config(str(folder), language_model("token_file"))
    config.data.update(dataset="source", source=f"files:{tmp_path}/text.jsonl",
                       tokenizer=str(folder / "tokenizer.json"))
    config.eval.update(every=2, batch_size=8, benchmarks="hellaswag:1,lambada_openai:2")
    experiment = build(config)
    evaluators = experiment.evaluators()
    assert [(e.name, e.every) for e in evaluators] == [("hellaswag", 2), ("lambada_openai", 2)]
    params = models.hf_params(str(folder), config, experiment.init)
    expected = json.loads((FIXTURES / "gpt2.json").read_text())["tasks"]
    for evaluator, limit in zip(evaluators, (1, 2), strict=True):
        task = tasks.TASKS[evaluator.name]
        responses = [[tuple(request) for request in document] for document in expected[task.name]["responses"]]
        theirs = tasks.aggregate(task, tasks.documents(task, limit), responses[:limit])
        assert evaluator.evaluate(params) == pytest.approx({metric: theirs[metric] for metric in task.metrics},
                                                           rel=1e-5)
    mesh = make_mesh(config.mesh.to_dict())  # data over the 8 test devices: the batches split over them
    on_mesh = jax.device_put(params, NamedSharding(mesh, PartitionSpec()))
    assert evaluators[1].evaluate(on_mesh) == pytest.approx(evaluators[1].evaluate(params), rel=1e-5)

    characters = language_model()
    characters.eval.benchmarks = "hellaswag:5"
    with pytest.raises(UserError, match="eval.benchmarks=hellaswag:5: the tasks are text, scored through the run's "
                                        "BPE tokenizer, and this run reads tinyshakespeare as characters"):
        build(characters)
    for spec, message in [("helaswag:5", "unknown task 'helaswag'; the tasks are hellaswag,"),
                          ("hellaswag:0", "'hellaswag:0' is not task:N with N >= 1"),
                          ("hellaswag", "'hellaswag' is not task:N")]:
        config.eval.benchmarks = spec
        with pytest.raises(UserError, match=message):
            build(config)


@pytest.mark.slow
def test_a_character_level_run_is_scored_character_by_character_and_says_so():
    """A run that reads characters: each task text is its characters' ids (those the vocabulary lacks dropped and
    reported), a request's log-likelihood the sum over the continuation's characters of log p(character | the ones
    before), computed here directly from the model's full logits; a run without a tokenizer is one line."""
    from lm.data.text import CharTokenizer
    from lm.layers.transformer import TransformerConfig
    from lm.models.gpt import GPT, GPTConfig

    vocabulary = CharTokenizer.fit("\nabc ")
    blocks = TransformerConfig(num_layers=1, num_heads=2, num_kv_heads=2, embed_dim=16)
    model = GPT(GPTConfig(vocab_size=vocabulary.vocab_size, context_length=16, transformer=blocks, vocab_multiple=8))
    params = model.init(jax.random.key(0), jnp.zeros((1, 16), jnp.int32))["params"]
    scorer = models.run_scorer(model, params, vocabulary, context_length=16, batch_size=2)
    assert "scored character by character" in scorer.encode.note()
    (loglikelihood, _), = token_loglikelihoods(scorer, [encode_pair(scorer.encode, "ab", " c9", None)])
    ids = vocabulary.encode("ab c")  # '9' is not in the vocabulary: dropped
    log_probs = jax.nn.log_softmax(model.apply({"params": params}, jnp.asarray(ids)[None, :-1])[0], axis=-1)
    assert loglikelihood == pytest.approx(float(log_probs[1, ids[2]] + log_probs[2, ids[3]]), abs=1e-5)
    assert scorer.encode.report() == "dropped from the texts (not in the run's vocabulary): 1 characters: '9'"
    assert scorer.prefix_token_id == vocabulary.encode("\n")[0]  # a text's first character follows a newline
    with pytest.raises(UserError, match="this run has no tokenizer .*: the tasks are text"):
        models.run_scorer(model, params, None, context_length=16)


def test_the_table_says_what_lambadas_metrics_are():
    metrics = {"perplexity": 41.5, "perplexity_stderr": None, "acc": 0.25, "acc_stderr": 0.25}
    printed = report.table([report.TaskResult(tasks.TASKS["lambada_openai"], 4, metrics, [], 0.1)])
    assert printed.splitlines()[-1] == ("lambada_openai: perplexity of the passages' last words (exp of minus their "
                                        "mean log-likelihood); acc: the share of passages whose last word is the "
                                        "model's greedy continuation")


def test_choices_share_their_context_and_groups_are_packed_into_rows():
    """Requests with the same context ids, after the cut from the left, are one group: the context once, then each
    continuation but its last id; a group longer than max_length is split; rows are as long as the bucket of their
    longest group and filled with the longest groups that fit."""
    requests = [([1, 2, 3], [4, 5]), ([1, 2, 3], [6]), ([7], [8, 9]), ([1, 2, 3], [4, 4, 4, 4]),
                ([9, 1, 2, 3], [4, 5, 6, 7, 8, 9])]  # the last is cut from the left to [1, 2, 3] + its 6 ids
    found = scoring.groups(requests, max_length=8)
    assert [(list(context), [index for index, _ in members]) for context, members in found] == [
        ([1, 2, 3], [0, 1, 3]), ([1, 2, 3], [4]), ([7], [2])]  # the last would make the first 3+1+0+3+5 > 8
    assert [scoring.group_length(group) for group in found] == [7, 8, 2]
    rows = scoring.pack(found, [4, 8])
    assert [(bucket, [scoring.group_length(g) for g in row]) for bucket, row in rows] == [(8, [8]), (8, [7]),
                                                                                         (4, [2])]
    assert [len(row) for _, row in scoring.pack(found[2:] * 3 + found[1:2], [4, 8])] == [1, 2, 1]  # 8; 2+2 in 4; 2


def small_gpt():
    from lm.layers.transformer import TransformerConfig
    from lm.models.gpt import GPT, GPTConfig

    blocks = TransformerConfig(num_layers=2, num_heads=2, num_kv_heads=2, embed_dim=16)
    return GPT(GPTConfig(vocab_size=20, context_length=16, transformer=blocks, vocab_multiple=8))


def test_the_scorer_of_an_equal_model_is_the_same_program():
    """score_batch is jitted per apply: a model built again (a second `lm eval` in one process builds it) gives an
    equal apply, so its programs are not compiled again."""
    assert gpt_apply(small_gpt()) == gpt_apply(small_gpt())
    assert hash(gpt_apply(small_gpt())) == hash(gpt_apply(small_gpt()))


@pytest.mark.slow
def test_packed_shared_contexts_equal_each_request_scored_alone():
    """A small GPT: every request's log-likelihood and is_greedy through the packed rows (contexts shared, groups
    packed, some cut from the left, one group split) equal the model's full logits on the request alone. A second
    Scorer of an equal model compiles nothing."""
    model = small_gpt
    params = model().init(jax.random.key(0), jnp.zeros((1, 16), jnp.int32))["params"]
    rng = np.random.default_rng(0)
    requests = []
    for context_length, choices in [(5, 4), (9, 2), (1, 3), (14, 4), (20, 2), (3, 1)]:
        context = list(rng.integers(0, 20, context_length))
        requests += [(context, list(rng.integers(0, 20, rng.integers(1, 6)))) for _ in range(choices)]
    scorer = Scorer(gpt_apply(model()), params, None, max_length=16, prefix_token_id=0, batch_size=8,
                    num_buckets=1, scored_chunk=64)  # one batch: one program
    found = token_loglikelihoods(scorer, requests)
    sequences = [[*context, *continuation][-17:] for context, continuation in requests]
    inputs = np.zeros((len(requests), 16), np.int32)  # each request alone in a row, right-padded (causal)
    for row, sequence in enumerate(sequences):
        inputs[row, :len(sequence) - 1] = sequence[:-1]
    all_logits = np.asarray(jax.jit(model().apply)({"params": params}, inputs))
    for sequence, (_, continuation), logits, (loglikelihood, greedy) in zip(sequences, requests, all_logits, found,
                                                                            strict=True):
        count, targets = len(continuation), np.asarray(sequence[-len(continuation):])
        logits = logits[len(sequence) - 1 - count:len(sequence) - 1]
        log_probs = np.asarray(jax.nn.log_softmax(logits))[np.arange(count), targets]
        assert loglikelihood == pytest.approx(float(log_probs.sum()), abs=1e-5)
        assert greedy == bool(np.all(np.argmax(logits, -1) == targets))
    compiled = scoring.score_batch._cache_size()
    again = dataclasses.replace(scorer, apply=gpt_apply(model()))
    assert token_loglikelihoods(again, requests) == found and scoring.score_batch._cache_size() == compiled
