"""Multi30k pairs, the SentencePiece and word tokenizers, length-bucketed batches and BLEU."""

import collections
import gzip
import json
import math
import os
import unicodedata

import numpy as np
import pytest

from lm.data import bleu, files
from lm.data import translation as tr
from lm.errors import UserError

MULTI30K_FILES = [f"{split}.{lang}.gz" for split in tr.SPLITS for lang in tr.LANGUAGES]


@pytest.fixture(scope="session")
def multi30k(data_dir):
    """$LM_DATA_DIR/multi30k with all six files (fails, naming the missing paths, otherwise)."""
    folder = data_dir / "multi30k"
    missing = [str(folder / name) for name in MULTI30K_FILES if not (folder / name).is_file()]
    if missing:
        pytest.fail(f"Multi30k files missing (set LM_DATA_DIR to the shared data folder): {missing}")
    return folder


@pytest.fixture(scope="module")
def pairs(multi30k):
    return {split: tr.load_pairs(split) for split in tr.SPLITS}


# --- sentence pairs ---------------------------------------------------------------------------


def test_split_sizes_alignment_and_direction(pairs):
    assert {split: (len(s), len(t)) for split, (s, t) in pairs.items()} == {
        "train": (29000, 29000), "val": (1014, 1014), "test_2016_flickr": (1000, 1000)}
    de, en = pairs["train"]
    assert de[0] == "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche."
    assert en[0] == "Two young, White males are outside near many bushes."
    assert pairs["val"][1][0] == "A group of men are loading cotton onto a truck"
    assert pairs["test_2016_flickr"][0][-1] == "Ein Mädchen an einer Küste mit einem Berg im Hintergrund."
    # Only the newline is removed: the trailing spaces of some German training lines survive.
    assert not any("\n" in s for s in de + en)
    assert de[5908] == "Ein junger Mann springt mitten in der Luft auf einem Trampolin. "
    en_de = tr.load_pairs("val", source_lang="en", target_lang="de")
    assert en_de == (pairs["val"][1], pairs["val"][0])


def test_unknown_split_or_language_is_a_user_error(multi30k):
    with pytest.raises(UserError, match="unknown Multi30k split 'test'"):
        tr.load_pairs("test")
    with pytest.raises(UserError, match="unknown Multi30k language 'fr'"):
        tr.load_pairs("val", "fr", "en")
    with pytest.raises(UserError, match="both 'de'"):
        tr.load_pairs("val", "de", "de")


def write_gz(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))


def test_misaligned_files_are_a_user_error(tmp_path, monkeypatch):
    write_gz(tmp_path / "multi30k" / "val.de.gz", ["a", "b"])
    write_gz(tmp_path / "multi30k" / "val.en.gz", ["a", "b", "c"])
    monkeypatch.setenv("LM_DATA_DIR", str(tmp_path))
    with pytest.raises(UserError, match="not line-aligned.*val.de.gz has 2 lines.*val.en.gz has 3"):
        tr.load_pairs("val")


def test_missing_data_names_the_paths(tmp_path, monkeypatch):
    empty = tmp_path / "data"
    empty.mkdir()
    monkeypatch.setenv("LM_DATA_DIR", str(empty))
    monkeypatch.setenv("LM_OFFLINE", "1")
    monkeypatch.setattr(files, "CACHE_DIR", tmp_path / "cache")
    with pytest.raises(UserError) as error:
        tr.load_pairs("train")
    message = str(error.value)
    assert str(empty / "multi30k" / "train.de.gz") in message
    assert str(tmp_path / "cache" / "multi30k" / "train.de.gz") in message
    assert "LM_DATA_DIR" in message


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def source_data(**changes):
    from configs import base

    data = base.translation().data
    data.update(changes)
    return data


def test_source_pairs_are_the_records_fields_with_held_out_val_and_test(tmp_path):
    """data.source's records as (data.source_field, data.target_field) pairs in file order; without their own
    sources val and test are held out from its end (test last), with them they are theirs."""
    from experiments.translation import read_pairs

    records = [{"fr": f"phrase {i}", "de": f"Satz {i}", "en": f"sentence {i}"} for i in range(7)]
    write_jsonl(tmp_path / "pairs.jsonl", records)
    spec = f"files:{tmp_path}/pairs.jsonl"

    def sides(rows, source="de", target="en"):
        return [r[source] for r in rows], [r[target] for r in rows]

    pairs = read_pairs(source_data(source=spec, held_out_pairs=2))
    assert pairs == {"train": sides(records[:3]), "val": sides(records[3:5]), "test": sides(records[5:])}
    write_jsonl(tmp_path / "val.jsonl", records[:1])
    pairs = read_pairs(source_data(source=spec, val_source=f"files:{tmp_path}/val.jsonl", held_out_pairs=3,
                                   source_field="en", target_field="fr", max_train_pairs=2))
    assert pairs == {"train": sides(records[:2], "en", "fr"), "val": sides(records[:1], "en", "fr"),
                     "test": sides(records[4:], "en", "fr")}
    with pytest.raises(UserError, match=r"data.source has 3 sentence pairs left: too few to hold out "
                                        r"data.held_out_pairs=4 for val .*data.val_source"):
        read_pairs(source_data(source=spec, held_out_pairs=4))


def test_a_record_without_its_target_field_is_one_line_naming_the_source_file_and_record(tmp_path, capsys):
    from experiments.translation import read_pairs

    write_jsonl(tmp_path / "pairs.jsonl", [{"de": "a", "en": "A"}, {"de": "b"}, {"de": "c", "en": "C"},
                                           {"de": "d", "en": "D"}])
    spec = f"files:{tmp_path}/pairs.jsonl"
    with pytest.raises(UserError) as error:
        read_pairs(source_data(source=spec, held_out_pairs=1))
    assert str(error.value) == (f"data.source={spec}: {tmp_path}/pairs.jsonl line 2: has no field 'en' (its fields: "
                                "de): set --config.data.target_field; fix or remove it, or pass "
                                "--config.data.skip_bad_records=True to skip such records")
    pairs = read_pairs(source_data(source=spec, held_out_pairs=1, skip_bad_records=True))
    assert pairs == {"train": (["a"], ["A"]), "val": (["c"], ["C"]), "test": (["d"], ["D"])}
    assert capsys.readouterr().err.startswith(f"warning: skipped 1 bad records of data.source={spec} (the first: ")


# --- tokenizers -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sp_tokenizers(pairs):
    """Per-language unigram models on the first 2000 training pairs (fast; the real run uses all)."""
    de, en = pairs["train"]
    return tr.build_tokenizers("sentencepiece", de[:2000], en[:2000], vocab_size=1000)


def spm_normalised(text: str) -> str:
    """What SentencePiece's nmt_nfkc normalisation and whitespace clean-up make of text."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def test_sentencepiece_round_trip_on_val(pairs, sp_tokenizers):
    for tokenizer, sentences in zip(sp_tokenizers, pairs["val"], strict=True):
        assert 900 <= tokenizer.vocab_size <= 1000
        decoded = [tokenizer.decode(tokenizer.encode(s)) for s in sentences]
        assert decoded == [spm_normalised(s) for s in sentences]
        # All but one (a no-break space in German val line 'ca. 120\xa0cm') round-trip exactly.
        assert sum(d != s for d, s in zip(decoded, sentences, strict=True)) <= 1


def test_sentencepiece_special_ids_and_decode_stops_at_eos(sp_tokenizers):
    tokenizer = sp_tokenizers[1]
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2, 3)
    assert [tokenizer._sp.id_to_piece(i) for i in range(4)] == ["<pad>", "<unk>", "<bos>", "<eos>"]
    ids = tokenizer.encode("A dog runs.")
    assert min(ids) >= 4
    assert tokenizer.decode([tr.BOS_ID, *ids, tr.EOS_ID, *ids, tr.PAD_ID]) == "A dog runs."
    source, target = tr.encode_pairs(["A dog runs."], ["A dog runs."], tokenizer, tokenizer)
    assert source[0].tolist() == [*ids, tr.EOS_ID]
    assert target[0].tolist() == [tr.BOS_ID, *ids, tr.EOS_ID]


def test_sentencepiece_save_load_and_determinism(pairs, sp_tokenizers, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # training must leave no files behind in the working directory
    de_tokenizer, en_tokenizer = sp_tokenizers
    again = tr.SentencePieceTokenizer.train(pairs["train"][0][:2000], vocab_size=1000)
    assert again.model_proto == de_tokenizer.model_proto
    assert os.listdir(tmp_path) == []
    tr.save_tokenizers(tmp_path / "run", de_tokenizer, en_tokenizer)
    assert sorted(p.relative_to(tmp_path / "run").as_posix() for p in (tmp_path / "run").rglob("*.*")) == [
        "tokenizers/source/sentencepiece.model", "tokenizers/target/sentencepiece.model"]
    loaded = tr.load_tokenizers(tmp_path / "run")
    for original, restored, sentences in zip(sp_tokenizers, loaded, pairs["val"], strict=True):
        assert isinstance(restored, tr.SentencePieceTokenizer)
        assert [restored.encode(s) for s in sentences] == [original.encode(s) for s in sentences]
    bpe = tr.SentencePieceTokenizer.train(pairs["train"][1][:2000], vocab_size=800, model_type="bpe")
    assert bpe.encode("A dog runs.") != en_tokenizer.encode("A dog runs.")
    assert bpe.decode(bpe.encode("A dog runs.")) == "A dog runs."
    with pytest.raises(UserError, match="model_type='wordpiece'"):
        tr.SentencePieceTokenizer.train(["a b"], 10, model_type="wordpiece")


def test_word_tokenize_lowercases_and_splits_punctuation():
    assert tr.word_tokenize("A man's T-shirt, 3.5 m.") == ["a", "man", "'s", "t", "-", "shirt", ",", "3.5", "m", "."]
    assert tr.word_tokenize("They don't <unk>!") == ["they", "do", "n't", "<unk>", "!"]
    assert tr.word_tokenize("Zwei Männer (im Freien).") == ["zwei", "männer", "(", "im", "freien", ")", "."]
    assert tr.word_tokenize("A Dog", lowercase=False) == ["A", "Dog"]


def test_word_tokenizer_min_freq_unk_and_save(tmp_path):
    tokenizer = tr.WordTokenizer.fit(["A dog runs.", "The dog sleeps.", "a DOG!"], min_freq=2)
    # dog 3, a 2, . 2; everything else once: below min_freq.
    assert tokenizer.tokens == ["<pad>", "<unk>", "<bos>", "<eos>", "dog", ".", "a"]
    assert tokenizer.encode("A dog sleeps.") == [6, 4, tr.UNK_ID, 5]
    assert tokenizer.decode([tr.BOS_ID, 6, 4, tr.UNK_ID, 5, tr.EOS_ID, 4]) == "a dog <unk> ."
    tokenizer.save(tmp_path)
    restored = tr.load_tokenizer(tmp_path)
    assert isinstance(restored, tr.WordTokenizer) and restored.tokens == tokenizer.tokens
    with pytest.raises(UserError, match="no tokenizer in"):
        tr.load_tokenizer(tmp_path / "nothing")


def test_word_vocabulary_of_multi30k(pairs):
    """min_freq 2 gives vocabularies close to the tutorials' spaCy ones (de 7853, en 5893)."""
    de_tokenizer, en_tokenizer = tr.build_tokenizers("word", *pairs["train"])
    assert (de_tokenizer.vocab_size, en_tokenizer.vocab_size) == (7882, 5899)


# --- bucketed batches -------------------------------------------------------------------------


def synthetic_pairs(num: int, seed: int = 0, max_tokens: int = 70):
    """Pairs whose ids encode the example number (first source token = 4 + i) and random lengths."""
    rng = np.random.default_rng(seed)
    sources, targets = [], []
    for i in range(num):
        n_s, n_t = rng.integers(1, max_tokens, size=2)
        sources.append(np.array([4 + i, *rng.integers(4, 50, size=n_s - 1), tr.EOS_ID], np.int32))
        targets.append(np.array([tr.BOS_ID, *rng.integers(4, 50, size=n_t), tr.EOS_ID], np.int32))
    return sources, targets


def take(iterator, n):
    return [next(iterator) for _ in range(n)]


def check_batch(batch, sources, targets, buckets, batch_size):
    length = batch["source"].shape[1]
    assert length in buckets
    for key in ("source", "source_mask", "decoder_inputs", "targets", "target_mask"):
        assert batch[key].shape == (batch_size, length) and batch[key].dtype == np.int32
    assert batch["index"].shape == batch["valid"].shape == (batch_size,)
    np.testing.assert_array_equal(batch["source_mask"], batch["source"] != 0)
    np.testing.assert_array_equal(batch["target_mask"], batch["targets"] != 0)
    np.testing.assert_array_equal(batch["decoder_inputs"] != 0, batch["targets"] != 0)
    np.testing.assert_array_equal(batch["valid"], batch["index"] >= 0)
    needed = []
    for row in range(batch_size):
        i = batch["index"][row]
        if i < 0:
            assert not batch["source"][row].any() and not batch["targets"][row].any()
            continue
        s, t = sources[i], targets[i]
        needed.append(max(len(s), len(t) - 1))
        np.testing.assert_array_equal(batch["source"][row, : len(s)], s)
        np.testing.assert_array_equal(batch["decoder_inputs"][row, : len(t) - 1], t[:-1])
        np.testing.assert_array_equal(batch["targets"][row, : len(t) - 1], t[1:])
        assert batch["source_mask"][row].sum() == len(s) and batch["target_mask"][row].sum() == len(t) - 1
    # The batch is padded to the smallest bucket that fits its longest pair.
    assert length == min(b for b in buckets if b >= max(needed))


def test_train_batches_cover_each_epoch_once_in_bucket_shapes():
    sources, targets = synthetic_pairs(1000)
    buckets = (16, 32, 48, 64)
    ds = tr.BucketedBatches(sources, targets, batch_size=32, seed=0, buckets=buckets)
    kept = [i for i in range(1000) if max(len(sources[i]), len(targets[i]) - 1) <= 64]
    assert ds.num_dropped == 1000 - len(kept) > 0
    assert len(ds) == math.ceil(len(kept) / 32)
    it = iter(tr.train_batches(sources, targets, batch_size=32, seed=0, buckets=buckets))
    epochs = [take(it, len(ds)) for _ in range(2)]
    for epoch in epochs:
        for batch in epoch:
            check_batch(batch, sources, targets, buckets, 32)
        seen = np.concatenate([b["index"][b["valid"] == 1] for b in epoch])
        assert sorted(seen) == kept
        assert sum((b["valid"] == 0).any() for b in epoch) == (1 if len(kept) % 32 else 0)
        assert {b["source"].shape[1] for b in epoch} == set(buckets)
        lengths = [b["source"].shape[1] for b in epoch]
        assert lengths != sorted(lengths)  # the batch order is shuffled, not bucket by bucket
    first, second = (np.concatenate([b["index"] for b in epoch]) for epoch in epochs)
    assert not np.array_equal(first, second)  # a new order (and new batches) each epoch


def test_train_batches_are_seeded_and_resume_exactly_at_any_step():
    sources, targets = synthetic_pairs(300)
    make = lambda seed: iter(tr.train_batches(sources, targets, batch_size=16, seed=seed))  # noqa: E731
    straight = take(make(0), 50)  # 300 pairs = 19 batches an epoch: crosses two epoch boundaries
    same = take(make(0), 50)
    for a, b in zip(straight, same, strict=True):
        np.testing.assert_array_equal(a["source"], b["source"])
    assert not np.array_equal(straight[0]["index"], next(make(1))["index"])

    resumed = iter(tr.train_batches(sources, targets, batch_size=16, seed=0, start_step=23))
    for expected, got in zip(straight[23:], take(resumed, 27), strict=True):
        assert expected.keys() == got.keys()
        for key in expected:
            np.testing.assert_array_equal(expected[key], got[key])


def test_process_shards_split_each_global_batch():
    sources, targets = synthetic_pairs(400)
    whole = take(iter(tr.train_batches(sources, targets, batch_size=16, seed=5)), 30)
    parts = [take(iter(tr.train_batches(sources, targets, batch_size=8, seed=5, shard=(i, 2))), 30) for i in range(2)]
    for batch, first, second in zip(whole, *parts, strict=True):
        assert first["source"].shape == second["source"].shape == (8, batch["source"].shape[1])
        for key in batch:
            np.testing.assert_array_equal(batch[key], np.concatenate([first[key], second[key]]))


def test_real_train_epoch_with_word_tokenizer(pairs):
    de, en = pairs["train"]
    tokenizers = tr.build_tokenizers("word", de, en)
    sources, targets = tr.encode_pairs(de, en, *tokenizers)
    it = iter(tr.train_batches(sources, targets, batch_size=128, seed=0))
    epoch = take(it, math.ceil(29000 / 128))
    assert sorted(np.concatenate([b["index"][b["valid"] == 1] for b in epoch])) == list(range(29000))
    assert {b["source"].shape for b in epoch} <= {(128, n) for n in tr.DEFAULT_BUCKETS}
    check_batch(epoch[0], sources, targets, tr.DEFAULT_BUCKETS, 128)


def test_eval_batches_keep_order_and_flag_padding_rows():
    sources, targets = synthetic_pairs(50, max_tokens=30)
    long_sources, long_targets = synthetic_pairs(2, seed=1, max_tokens=200)
    long_sources = [np.array([100, *np.full(79, 7), tr.EOS_ID], np.int32), long_sources[1]]
    sources[5], targets[5] = long_sources[0], long_targets[0]  # 81 source ids: truncated
    sources[37], targets[37] = long_sources[1], long_targets[1]
    buckets = (16, 32, 48, 64)
    batches = tr.eval_batches(sources, targets, batch_size=16, buckets=buckets)
    assert len(batches) == 4
    index = np.concatenate([b["index"] for b in batches])
    np.testing.assert_array_equal(index, np.r_[np.arange(50), np.full(14, -1)])
    np.testing.assert_array_equal(np.concatenate([b["valid"] for b in batches]), index >= 0)
    needed = tr.needed_lengths(sources, targets)
    for i, b in enumerate(batches):
        longest = needed[16 * i : 16 * i + 16].max()
        assert b["source"].shape == (16, min([n for n in buckets if n >= longest] + [64]))
        np.testing.assert_array_equal(b["source_mask"], b["source"] != 0)
        np.testing.assert_array_equal(b["target_mask"], b["targets"] != 0)
        assert not b["source"][b["valid"] == 0].any() and not b["target_mask"][b["valid"] == 0].any()
    # Over-long pairs are truncated to the largest bucket, ending in eos, never dropped.
    long = [i for i in range(50) if max(len(sources[i]), len(targets[i]) - 1) > 64]
    assert 5 in long and [b["source"].shape[1] for b in batches] == [64, 32, 64, 16]
    for i in long:
        b, row = batches[i // 16], i % 16
        assert b["source"].shape[1] == 64
        s_len, t_len = b["source_mask"][row].sum(), b["target_mask"][row].sum()
        assert b["source"][row, s_len - 1] == tr.EOS_ID and b["targets"][row, t_len - 1] == tr.EOS_ID
        assert b["decoder_inputs"][row, 0] == tr.BOS_ID


# --- BLEU -------------------------------------------------------------------------------------


def test_bleu_of_identical_text_is_100():
    sentences = ["A man in an orange hat starring at something.", "Two dogs play in the snow."]
    assert bleu.corpus_bleu(sentences, sentences) == pytest.approx(100.0)
    assert bleu.tokenized_bleu(sentences, sentences) == pytest.approx(100.0)


def test_bleu_matches_a_hand_computed_value():
    # Precisions 6/6, 4/5, 3/4, 2/3; hypothesis 6 tokens, reference 7: BP = exp(1 - 7/6).
    expected = 100 * math.exp(1 - 7 / 6) * (1 * 4 / 5 * 3 / 4 * 2 / 3) ** 0.25  # 67.32
    hypothesis, reference = ["the cat sat on the mat"], ["the cat sat on the red mat"]
    assert bleu.corpus_bleu(hypothesis, reference) == pytest.approx(expected)
    assert bleu.tokenized_bleu(hypothesis, reference) == pytest.approx(expected)
    with pytest.raises(ValueError, match="1 hypotheses for 2 references"):
        bleu.corpus_bleu(hypothesis, reference * 2)


def torchtext_bleu(candidates: list[list[str]], references: list[list[str]]) -> float:
    """torchtext.data.metrics.bleu_score (one reference each, BLEU-4, uniform weights), x 100."""
    clipped, totals, candidate_len, reference_len = np.zeros(4), np.zeros(4), 0, 0
    for candidate, reference in zip(candidates, references, strict=True):
        candidate_len, reference_len = candidate_len + len(candidate), reference_len + len(reference)
        for n in range(1, 5):
            grams = collections.Counter(tuple(candidate[i : i + n]) for i in range(len(candidate) - n + 1))
            ref_grams = collections.Counter(tuple(reference[i : i + n]) for i in range(len(reference) - n + 1))
            clipped[n - 1] += sum((grams & ref_grams).values())
            totals[n - 1] += max(len(candidate) - n + 1, 0)
    if clipped.min() == 0:
        return 0.0
    return 100 * math.exp(min(1 - reference_len / candidate_len, 0)) * math.exp(np.log(clipped / totals).mean())


def test_tokenized_bleu_is_torchtext_bleu_on_lowercased_word_tokens(pairs):
    references = pairs["val"][1][:200]
    # Degraded hypotheses: every third sentence loses its last word, every fifth is upper-cased.
    hypotheses = [" ".join(r.split()[:-1]) if i % 3 == 0 else r.upper() if i % 5 == 0 else r
                  for i, r in enumerate(references)]
    expected = torchtext_bleu([tr.word_tokenize(h) for h in hypotheses], [tr.word_tokenize(r) for r in references])
    assert 50 < expected < 100
    assert bleu.tokenized_bleu(hypotheses, references) == pytest.approx(expected)
    # No smoothing, as in torchtext: no matching 4-gram anywhere gives 0.
    assert bleu.tokenized_bleu(["a dog runs fast"], ["a dog runs slowly"]) == 0.0
    assert bleu.corpus_bleu(["a dog runs fast"], ["a dog runs slowly"]) > 0  # sacreBLEU's exp smoothing


def test_tokenized_bleu_ignores_case_and_standard_does_not():
    hypothesis, reference = ["a man rides a brown horse ."], ["A man rides a brown horse."]
    assert bleu.tokenized_bleu(hypothesis, reference) == pytest.approx(100.0)
    standard = bleu.corpus_bleu(hypothesis, reference)
    assert 0 < standard < 100  # 'a' vs 'A' costs one 1-gram and the n-grams through it
    assert bleu.tokenize_for_bleu("A man's T-shirt.") == "a man 's t - shirt ."
