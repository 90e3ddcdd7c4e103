"""BERT fine-tuning: the tasks' encoding (first-piece tags, SQuAD windows and offsets), bad input, and a
tiny pretrain -> fine-tune run through the trainer with init_from."""

import json
import shutil

import numpy as np
import pytest

from lm.cli.resolve import build_experiment
from lm.data.tasks import conll2003, squad
from lm.errors import UserError


@pytest.fixture(scope="module")
def tokenizer(data_dir):
    from lm.data.wordpiece import WordPieceTokenizer

    return WordPieceTokenizer.from_vocab("bert-base-uncased")


def test_tags_go_on_each_words_first_piece(tokenizer):
    sentences = [conll2003.Sentence(("Nadim", "Ladki", "visited", "Leicestershire"), ("B-PER", "I-PER", "O", "B-LOC")),
                 conll2003.Sentence(("EU", "rejects", "German", "call"), ("B-ORG", "O", "B-MISC", "O"))]
    rows, word_starts = conll2003.encode(tokenizer, sentences, 16)
    pieces = tokenizer.id_pieces(rows["tokens"][0][: rows["mask"][0].sum()])
    assert pieces[:5] == ["[CLS]", "nad", "##im", "lad", "##ki"] and pieces[-1] == "[SEP]"
    assert list(word_starts[0]) == [1, 3, 5, 6]  # "leicestershire" is one piece or more; it starts at 6
    tag_ids = {t: i for i, t in enumerate(conll2003.TAGS)}
    for row, sentence in enumerate(sentences):
        starts = word_starts[row]
        assert np.flatnonzero(rows["tag_mask"][row]).tolist() == starts.tolist()  # only first pieces count
        assert rows["tags"][row, starts].tolist() == [tag_ids[t] for t in sentence.tags]
        assert not pieces[0].startswith("##")
        for s in starts:  # a first piece never continues a word
            assert not tokenizer.id_pieces([rows["tokens"][row, s]])[0].startswith("##")
    # predictions read back per word, from the first pieces only (the others' predictions are ignored)
    predicted = np.where(rows["tag_mask"] == 1, rows["tags"], tag_ids["B-LOC"])
    assert conll2003.word_tags(predicted, word_starts, sentences) == [list(s.tags) for s in sentences]
    # a row too short for the sentence: the words cut off are predicted O
    short_rows, short_starts = conll2003.encode(tokenizer, sentences[:1], 6)
    assert conll2003.word_tags(short_rows["tags"], short_starts, sentences[:1]) == [["B-PER", "I-PER", "O", "O"]]


def test_squad_windows_cover_the_context_and_map_answers_back(tokenizer):
    questions = squad.load("dev", 60)
    length, stride = 64, 16
    windows = squad.encode(tokenizer, questions, length, stride, max_query_length=16)
    q = max(range(len(questions)), key=lambda i: len(questions[i].context))
    question = questions[q]
    rows = np.flatnonzero(windows.question == q)
    assert len(rows) > 3  # a long context, read in several windows
    context_ids, context_offsets = tokenizer.encode_with_offsets(question.context)
    covered = {tuple(span) for r in rows for span in windows.offsets[r] if span[0] >= 0}
    assert covered == {tuple(span) for span in context_offsets}  # every context piece is in some window
    inside = [r for r in rows if windows.rows["start"][r] > 0]
    assert inside, "the answer lies in at least one window"
    answer = question.answers[0]
    for r in inside:
        start, end = windows.rows["start"][r], windows.rows["end"][r]
        assert windows.rows["span_mask"][r, start] and windows.rows["span_mask"][r, end]
        assert question.context[windows.offsets[r, start, 0] : windows.offsets[r, end, 1]] == answer
    for r in sorted(set(rows) - set(inside)):  # the answer is not wholly inside: the target is [CLS]
        assert windows.rows["start"][r] == windows.rows["end"][r] == 0
    # logits that point at the gold pieces decode to the answer's exact text
    start_logits = np.zeros(windows.rows["tokens"].shape)
    end_logits = np.zeros(windows.rows["tokens"].shape)
    start_logits[inside[0], windows.rows["start"][inside[0]]] = 10
    end_logits[inside[0], windows.rows["end"][inside[0]]] = 10
    answers = squad.predicted_answers(start_logits, end_logits, windows, questions, 30, 20)
    assert answers[question.id] == answer
    # no valid span (none is shorter than 0 pieces): every question unanswered, not answered ""
    assert squad.predicted_answers(start_logits, end_logits, windows, questions, 0, 20) == {}


def test_missing_file_and_bad_labels_are_one_line_errors(tmp_path, monkeypatch, data_dir):
    from configs import bert_finetune
    from experiments.finetune import build
    from lm.data.tasks import sst2, stsb

    for key in ("max_train_examples", "max_eval_examples"):
        config = bert_finetune.get_config("sst2_tiny")
        config.data[key] = -1
        with pytest.raises(UserError, match=rf"data.{key}=-1: give a count of examples, or 0 for all"):
            build(config)

    monkeypatch.setenv("LM_DATA_DIR", str(tmp_path))
    with pytest.raises(UserError, match=r"sst2/dev.tsv not found .*set LM_DATA_DIR to a folder holding sst2/dev.tsv"):
        sst2.load("dev")
    (tmp_path / "sst2").mkdir()
    (tmp_path / "sst2" / "dev.tsv").write_text("sentence\tlabel\ngood . \t1\nbad . \t2\n")
    with pytest.raises(UserError, match=r"dev.tsv:3: label '2' is not one of the task's labels \(0 or 1\)"):
        sst2.load("dev")
    (tmp_path / "conll2003").mkdir()
    (tmp_path / "conll2003" / "valid.txt").write_text("Paris NNP B-NP B-LOC\nis VBZ B-VP O\n\nRome NNP B-NP B-CITY\n")
    with pytest.raises(UserError, match=r"valid.txt:4: label 'B-CITY' is not one of the task's labels"):
        conll2003.load("valid")
    shutil.copytree(data_dir / "stsb" / "original", tmp_path / "stsb" / "original")
    lines = (tmp_path / "stsb" / "original" / "sts-test.tsv").read_text().splitlines()
    fields = lines[1].split("\t")
    fields[4] = "5.5"
    lines[1] = "\t".join(fields)
    (tmp_path / "stsb" / "original" / "sts-test.tsv").chmod(0o644)
    (tmp_path / "stsb" / "original" / "sts-test.tsv").write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=r"sts-test.tsv:2: label '5.5' is not one of the task's labels"):
        stsb.load("test")


def test_training_examples_are_a_draw_of_the_runs_seed_nested_and_the_same_for_every_arm(tokenizer):
    """data.max_train_examples draws its examples with config.seed (a learning curve's arms of a seed train on the
    same ones, a larger count's draw holds a smaller's), labels with their sentences; eval splits keep their first."""
    from configs import bert_finetune
    from experiments.finetune import load_splits
    from lm.data.tasks import sst2
    from lm.data.tasks.common import choose

    items = list(range(100))
    assert choose(items, 10) == items[:10] and choose(items, 0) == choose(items, 100) == items
    small, large = choose(items, 10, seed=1), choose(items, 40, seed=1)
    assert small == sorted(small) and set(small) < set(large) and small != items[:10]
    assert choose(items, 10, seed=1) == small != choose(items, 10, seed=2)
    sentences, labels = sst2.load("train")
    picked = choose(range(len(labels)), 250, seed=3)
    drawn, drawn_labels = sst2.load("train", 250, seed=3)
    assert drawn == [sentences[i] for i in picked] and drawn_labels.tolist() == labels[picked].tolist()
    every = conll2003.load("train")
    assert conll2003.load("train", 5, seed=3) == [every[i] for i in choose(range(len(every)), 5, seed=3)] != every[:5]

    config = bert_finetune.get_config("sst2_tiny")  # 256 training examples, the first 64 of dev
    config.seed = 3
    splits = load_splits(config, tokenizer)
    expected = sst2.encode(tokenizer, "train", config.data.max_seq_len, 256, seed=3)
    np.testing.assert_array_equal(splits["train"].rows["tokens"], expected["tokens"])
    np.testing.assert_array_equal(splits["dev"].rows["label"], sst2.load("dev", 64)[1])
    config.init_from, config.optimizer.learning_rate = "runs/another_arm", 3e-4  # not read by the draw
    np.testing.assert_array_equal(load_splits(config, tokenizer)["train"].rows["label"], splits["train"].rows["label"])


def test_a_tasks_training_text_becomes_pretraining_documents_without_labels(tmp_path, data_dir):
    """experiments/task_text.py: STS-B's pairs, both sentences, in order, as jsonl documents that data.source reads
    back as one text a line (masked_lm.paragraphs)."""
    from experiments.task_text import task_texts, write_documents
    from lm.data.masked_lm import paragraphs
    from lm.data.sources import Source
    from lm.data.tasks import stsb

    firsts, seconds, _ = stsb.load("train")
    texts = task_texts("stsb")
    assert texts[:4] == [firsts[0], seconds[0], firsts[1], seconds[1]] and len(texts) == 2 * len(firsts)
    out = tmp_path / "text" / "stsb.jsonl"
    assert write_documents(texts, out, 8) == -(-len(texts) // 8)
    documents = [paragraphs(text) for _, text in Source(f"files:{out}")]
    assert [text for document in documents for text in document] == [" ".join(text.split()) for text in texts]
    assert {len(document) for document in documents[:-1]} == {8}
    with pytest.raises(UserError, match=r"--sentences_per_document=0: give 1 or more"):
        write_documents(texts, out, 0)


@pytest.mark.slow
def test_tiny_pretrain_then_fine_tune_through_the_trainer(tmp_path, data_dir, capsys):
    import jax

    from configs import bert, bert_finetune
    from lm.train.loop import train

    pretrain = bert.get_config("tiny")
    pretrain.train.update(num_steps=2, checkpoint_every=2)
    pretrain.eval.every = 0
    pretrain.data.max_documents = 6
    pretrain.model.num_layers = 1  # (fewer layers: less to compile)
    train(pretrain, str(tmp_path / "bert"), build_experiment, devices=jax.devices()[:1])

    config = bert_finetune.get_config("sst2_tiny")
    config.model.num_layers = 1  # as the pretraining run's
    config.init_from = str(tmp_path / "bert")
    config.data.update(max_train_examples=32, max_eval_examples=16)
    config.train.update(num_steps=2, checkpoint_every=2)
    config.eval.update(every=2, batch_size=16)
    capsys.readouterr()
    summary = train(config, str(tmp_path / "sst2"), build_experiment, devices=jax.devices()[:1])
    out = capsys.readouterr().out
    assert "loaded        23 arrays" in out and ": bert (23)" in out  # the whole encoder
    assert "initialised    2 arrays" in out and ": head (2)" in out  # the new classifier
    assert "mlm_head (5), nsp_head (2)" in out  # the pretraining heads, dropped
    assert 0 <= summary["dev_accuracy"] <= 1  # the evaluator's score during training
    results = json.loads((tmp_path / "sst2" / "results.json").read_text())
    assert 0 <= results["dev_accuracy"] <= 1 and np.isfinite(results["dev_loss"])
    # one pass gives the scores and the loss: the loss the trainer's own eval computed on the same rows
    assert results["dev_accuracy"] == summary["dev_accuracy"]
    assert results["dev_loss"] == pytest.approx(summary["eval_loss"], rel=1e-5)
    # the fine-tune read the pretraining run's own vocabulary (1000 trained pieces), and saved it
    saved = json.loads((tmp_path / "sst2" / "tokenizer" / "tokenizer.json").read_text())
    assert len(saved["model"]["vocab"]) == 1000


def test_a_vocabulary_other_than_the_pretraining_one_is_refused(tmp_path, tokenizer):
    from configs import bert_finetune
    from experiments.finetune import find_tokenizer
    from lm.data.wordpiece import WordPieceTokenizer

    pretrained = WordPieceTokenizer.train(["a few words to learn a vocabulary from"] * 4, vocab_size=40)
    pretrained.save(tmp_path / "run" / "tokenizer")
    config = bert_finetune.get_config("sst2_tiny")
    config.init_from = str(tmp_path / "run" / "checkpoints")  # the run's checkpoint folder: found above it
    assert find_tokenizer(config).tokenizer.get_vocab() == pretrained.tokenizer.get_vocab()
    config.data.vocab = "bert-base-uncased"
    with pytest.raises(UserError, match=r"data.vocab='bert-base-uncased' \(30522 pieces\) is not the vocabulary the "
                                        r"init_from run was pretrained with .*leave data.vocab empty"):
        find_tokenizer(config)
    config.init_from = str(tmp_path)  # no tokenizer saved there
    config.data.vocab = ""
    with pytest.raises(UserError, match="has no saved tokenizer"):
        find_tokenizer(config)


def test_train_batches_resume_and_shard_by_step():
    from lm.data.tasks.common import train_batches

    rows = {"tokens": np.arange(10)[:, None] * np.ones((1, 4), np.int32), "label": np.arange(10)}
    whole = [b["label"] for b, _ in zip(train_batches(rows, 4, seed=3), range(6), strict=False)]
    first_epoch = np.concatenate(whole[:2])
    assert len(set(first_epoch.tolist())) == 8  # no row twice within an epoch
    resumed = next(iter(train_batches(rows, 4, seed=3, start_step=4)))["label"]
    assert np.array_equal(resumed, whole[4])
    halves = [next(iter(train_batches(rows, 2, seed=3, shard=(i, 2), start_step=4)))["label"] for i in range(2)]
    assert np.array_equal(np.concatenate(halves), whole[4])
    with pytest.raises(UserError, match="fewer than one global batch"):
        train_batches(rows, 16, seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("task", ["squad"])  # windows of questions: the hardest rows to score in order
def test_scores_from_the_sharded_eval_pass_equal_a_direct_computation(data_dir, task):
    """The trainer's one eval pass over dev, its rows split over 4 devices and its last batch padded, gives
    the predictions of every real row in order: the task's scores (eval_scores, final_results) and the loss
    equal those of predicting all the rows at once on the host."""
    import flax.linen as nn
    import jax

    from configs import bert_finetune
    from experiments import finetune
    from lm.train import setup
    from lm.train.evaluate import Evaluations

    config = bert_finetune.get_config(f"{task}_tiny")
    config.model.num_layers = 1  # (less to compile)
    config.data.update(max_train_examples=16, max_eval_examples=10)  # SQuAD: 10 questions, more windows
    config.eval.batch_size = 12  # the last batch padded (valid 0)
    config.mesh.data = 4
    run = setup.build(config, finetune.build, jax.devices()[:4])
    experiment, dev = run.experiment, run.experiment.task.scored[0]
    with jax.set_mesh(run.mesh), nn.logical_axis_rules(run.rules):
        _, state_shardings = run.abstract_state()
        params = run.init_state(state_shardings).params
        evaluations = Evaluations(run, state_shardings.params)
        evaluation = evaluations.evaluate_batches(params, evaluations.eval_batches)
        final = evaluations.final_results(params, None)
    rows = experiment.splits[dev].rows
    padded = len(evaluations.eval_batches) * config.eval.batch_size
    assert len(evaluation.outputs["valid"]) == padded > len(rows["tokens"]) == evaluation.outputs["valid"].sum()

    outputs = experiment.model.apply({"params": jax.device_get(params)}, rows)  # every row, one device
    predicted = np.asarray(experiment.task.predict(outputs))
    direct = experiment.task.score(predicted, experiment.splits[dev])
    direct_loss = float(experiment.task.loss(outputs, rows)[0])
    np.testing.assert_allclose(evaluation.outputs["predicted"][evaluation.outputs["valid"] == 1], predicted,
                               rtol=1e-5, atol=1e-5)
    assert experiment.eval_scores(evaluation.outputs) == pytest.approx({f"dev_{k}": v for k, v in direct.items()})
    assert {k: final[f"{dev}_{k}"] for k in direct} == pytest.approx(direct)
    assert final[f"{dev}_loss"] == pytest.approx(direct_loss, rel=1e-5) == evaluation["loss"]


def test_init_from_is_checked_before_its_tokenizer_and_another_size_names_the_variant(tmp_path):
    """A missing init_from is reported as missing (not as a missing tokenizer); a pretraining run of another
    encoder size names the fields that differ, both values, and the variant of its size."""
    from configs import bert, bert_finetune
    from experiments.finetune import build

    config = bert_finetune.get_config("sst2")
    config.init_from = str(tmp_path / "gone")
    with pytest.raises(UserError, match=rf"^init_from={tmp_path}/gone not found: give a run folder written by lm "
                                        r"train, its checkpoints folder, or one step's folder$"):
        build(config)
    pretrain = bert.get_config("tiny")
    (tmp_path / "bert_tiny" / "checkpoints").mkdir(parents=True)
    (tmp_path / "bert_tiny" / "config.json").write_text(pretrain.to_json_best_effort())
    config.init_from = str(tmp_path / "bert_tiny" / "checkpoints")  # (found above it)
    with pytest.raises(UserError) as error:
        build(config)
    assert str(error.value) == (
        f"init_from={config.init_from} holds an encoder of another size: model.num_layers=2, model.num_heads=2, "
        "model.num_kv_heads=2, model.embed_dim=64, model.dropout=0.0, model.attention_dropout=0.0, "
        "model.max_positions=64 (its config.json), this config has model.num_layers=4, model.num_heads=4, "
        "model.num_kv_heads=4, model.embed_dim=256, model.dropout=0.1, model.attention_dropout=0.1, "
        "model.max_positions=512: use --config=configs/bert_finetune.py:sst2_tiny, the variant of that size")
    config = bert_finetune.get_config("sst2_tiny")  # that size: on to the tokenizer, which this run lacks
    config.init_from = str(tmp_path / "bert_tiny")
    with pytest.raises(UserError, match="has no saved tokenizer"):
        build(config)
    pretrain.model.num_layers = 1  # no variant has it
    (tmp_path / "bert_tiny" / "config.json").write_text(pretrain.to_json_best_effort())
    with pytest.raises(UserError, match=r"model.num_layers=1 \(its config.json\), this config has model.num_layers=2: "
                                        r"run with --config.model.num_layers=1$"):
        build(config)
