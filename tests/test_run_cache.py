"""A resumed run reads the tokenizer it saved and its tokenised corpus from its workdir (lm/data/run_cache.py):
it fits nothing and tokenises nothing again, and gets the same token ids; a changed data option misses."""

import json

import numpy as np

from lm.data import run_cache
from lm.runs import CONFIG_FILE, DATA_CACHE_DIR


def start_run(experiment, config, workdir) -> None:
    """What the trainer writes into the workdir before its first step: config.json, the tokenizers and the
    data cache."""
    (workdir / CONFIG_FILE).write_text(config.to_json_best_effort(indent=2))
    experiment.save_assets(workdir)


def refuse(*args, **kwargs):
    raise AssertionError("fitted or tokenised again")


def cache_entries(workdir) -> list[str]:
    return sorted(path.name for path in (workdir / DATA_CACHE_DIR).iterdir())


def test_a_resumed_language_model_reads_its_characters_and_ids(tmp_path, monkeypatch, data_dir, test_config):
    from experiments import language_model
    from lm.data import text

    first = language_model.build(test_config, tmp_path)
    assert not any(tmp_path.iterdir())  # build writes nothing: the trainer saves, once its checks pass
    start_run(first, test_config, tmp_path)
    encode = text.CharTokenizer.encode

    def encode_prompt_only(tokenizer, prompt):
        assert len(prompt) < 100, "the corpus encoded again"
        return encode(tokenizer, prompt)

    with monkeypatch.context() as patch:  # neither the corpus nor the fit nor its encoding again
        patch.setattr(text, "load_text", refuse)
        patch.setattr(text.CharTokenizer, "fit", refuse)
        patch.setattr(text.CharTokenizer, "encode", encode_prompt_only)
        resumed = language_model.build(test_config, tmp_path)
    assert resumed.tokenizer.chars == first.tokenizer.chars
    np.testing.assert_array_equal(resumed.train_tokens, first.train_tokens)
    np.testing.assert_array_equal(resumed.val_tokens, first.val_tokens)
    (entry,) = cache_entries(tmp_path)

    test_config.data.train_fraction = 0.8  # another data option: fitted and tokenised again, the entry replaced
    changed = language_model.build(test_config, tmp_path)
    assert cache_entries(tmp_path) == [entry]  # until the run's checks pass
    changed.save_assets(tmp_path)
    assert cache_entries(tmp_path) != [entry] and len(cache_entries(tmp_path)) == 1
    assert len(changed.train_tokens) == round(0.8 * (len(first.train_tokens) + len(first.val_tokens)))


def test_a_resumed_masked_lm_reads_its_vocabulary_and_pairs(tmp_path, monkeypatch, data_dir):
    from configs import bert
    from experiments import masked_lm
    from lm.data import masked_lm as masked_lm_data
    from lm.data.wordpiece import WordPieceTokenizer

    config = bert.get_config("tiny")  # a WordPiece vocabulary trained on the training documents
    config.data.update(max_documents=6, vocab_size=300)
    first = masked_lm.build(config, tmp_path)
    start_run(first, config, tmp_path)
    with monkeypatch.context() as patch:
        patch.setattr(WordPieceTokenizer, "train", refuse)
        patch.setattr(masked_lm_data, "read_documents", refuse)
        patch.setattr(masked_lm_data, "tokenize_documents", refuse)
        resumed = masked_lm.build(config, tmp_path)
    assert resumed.tokenizer.tokenizer.get_vocab() == first.tokenizer.tokenizer.get_vocab()
    for got, expected in ((resumed.train_pairs, first.train_pairs), (resumed.eval_pairs, first.eval_pairs)):
        assert len(got) == len(expected) > 0
        assert [(p.ids.tolist(), p.first_length) for p in got] == [(p.ids.tolist(), p.first_length) for p in expected]

    config.seed = 1  # the training pairs are drawn with the seed: not from the cache
    with monkeypatch.context() as patch:
        patch.setattr(WordPieceTokenizer, "train", refuse)  # (the vocabulary is the same data's: still read)
        reseeded = masked_lm.build(config, tmp_path)
    assert [p.ids.tolist() for p in reseeded.eval_pairs] == [p.ids.tolist() for p in first.eval_pairs]
    assert [p.ids.tolist() for p in reseeded.train_pairs] != [p.ids.tolist() for p in first.train_pairs]


def test_a_resumed_translation_reads_its_sentencepiece_models_and_ids(tmp_path, monkeypatch, data_dir):
    from configs import translate_transformer
    from experiments import translation
    from lm.data import translation as translation_data

    config = translate_transformer.get_config("test")
    config.data.max_train_pairs = 1000
    first = translation.build(config, tmp_path)
    start_run(first, config, tmp_path)
    with monkeypatch.context() as patch:
        patch.setattr(translation_data.SentencePieceTokenizer, "train", refuse)
        patch.setattr(translation_data, "load_pairs", refuse)
        patch.setattr(translation_data, "encode_pairs", refuse)
        resumed = translation.build(config, tmp_path)
    assert resumed.source_tokenizer.model_proto == first.source_tokenizer.model_proto
    for split, (sources, targets) in first.splits.items():
        got_sources, got_targets = resumed.splits[split]
        assert all(np.array_equal(a, b) for a, b in zip(got_sources + got_targets, sources + targets, strict=True))

    config.data.vocab_size = 400  # another vocabulary: fitted and encoded again
    changed = translation.build(config, tmp_path)
    changed.save_assets(tmp_path)
    assert changed.source_tokenizer.vocab_size <= 400 < first.source_tokenizer.vocab_size
    assert len(cache_entries(tmp_path)) == 1


def test_a_resumed_fine_tune_reads_its_encoded_splits(tmp_path, monkeypatch, data_dir):
    from configs import bert_finetune
    from experiments import finetune
    from lm.data.tasks import sst2

    config = bert_finetune.get_config("sst2_tiny")
    config.data.update(max_train_examples=32, max_eval_examples=16)
    first = finetune.build(config, tmp_path)
    start_run(first, config, tmp_path)
    with monkeypatch.context() as patch:
        patch.setattr(sst2, "encode", refuse)
        resumed = finetune.build(config, tmp_path)
    for split, loaded in first.splits.items():
        assert resumed.splits[split].rows.keys() == loaded.rows.keys()
        for name, rows in loaded.rows.items():
            np.testing.assert_array_equal(resumed.splits[split].rows[name], rows)

    config.data.max_seq_len = 32  # another row length: encoded again
    assert finetune.build(config, tmp_path).splits["dev"].rows["tokens"].shape == (16, 32)


def test_the_saved_tokenizer_is_read_only_for_the_same_data_options(tmp_path, test_config):
    fitted, loaded = object(), object()

    def choose():
        return run_cache.saved_or_fitted(tmp_path, test_config, "tokenizer.json", lambda path: loaded, lambda: fitted)

    (tmp_path / "tokenizer.json").write_text("{}")
    assert choose() is fitted  # no config.json: a new run
    (tmp_path / CONFIG_FILE).write_text(test_config.to_json_best_effort(indent=2))
    assert choose() is loaded
    saved = json.loads((tmp_path / CONFIG_FILE).read_text())
    saved["data"]["context_length"] += 1
    (tmp_path / CONFIG_FILE).write_text(json.dumps(saved))
    assert choose() is fitted
