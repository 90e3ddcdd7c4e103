"""Document sources (lm/data/sources.py) on fixtures made from Tiny Shakespeare's paragraphs: every files:
format, a TFDS dataset prepared in the test, the datasets library on local files; several fields a record
(sentence pairs); bad input as one line naming the source, the file and the record, or skipped and counted; the
processes' shares of the documents; the language model's packed pipeline resuming at any step byte for byte; and
a GPT trained on a files: jsonl source packed by document."""

import gzip
import itertools
import json
import sys

import jax
import numpy as np
import pyarrow
import pyarrow.parquet
import pytest

from lm.data.bpe import BPETokenizer
from lm.data.sources import Source, shard_documents
from lm.errors import UserError, run_user_errors

VOCAB = 300  # the byte-level BPE trained on the fixture's paragraphs


@pytest.fixture(scope="module")
def paragraphs(data_dir) -> list[str]:
    """The first 300 paragraphs of Tiny Shakespeare (a speaker's name and lines), the documents here."""
    text = (data_dir / "tinyshakespeare" / "input.txt").read_text()
    return [p for p in text.split("\n\n") if p.strip()][:300]


def write_jsonl(path, records, opener=open) -> None:
    with opener(path, "wt") as f:
        f.writelines(json.dumps(record) + "\n" for record in records)


def write_parquet(path, texts, column="text", row_group_size=None) -> None:
    pyarrow.parquet.write_table(pyarrow.table({column: texts}), path, row_group_size=row_group_size)


def texts(source) -> list[str]:
    return [text for _, text in source]


def test_files_read_every_format_in_sorted_order(tmp_path, paragraphs, monkeypatch):
    """.txt (a file a document), .jsonl, .jsonl.gz (blank lines skipped) and .parquet (a row group at a time),
    sorted by path; each document with its file and record; a relative glob found under $LM_DATA_DIR."""
    folder = tmp_path / "corpus"
    (folder / "b").mkdir(parents=True)
    (folder / "a.txt").write_text(paragraphs[0])
    write_jsonl(folder / "b" / "c.jsonl", [{"text": p, "id": i} for i, p in enumerate(paragraphs[1:4])])
    with (folder / "b" / "c.jsonl").open("a") as f:
        f.write("\n")
    write_jsonl(folder / "d.jsonl.gz", [{"text": p} for p in paragraphs[4:6]], opener=gzip.open)
    write_parquet(folder / "e.parquet", paragraphs[6:11], row_group_size=2)

    monkeypatch.setenv("LM_DATA_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path / "corpus" / "b")  # nothing matches here: the glob is read under $LM_DATA_DIR
    documents = list(Source("files:corpus/**/*"))
    assert [text for _, text in documents] == paragraphs[:11]
    assert [where.removeprefix(str(folder) + "/") for where, _ in documents] == [
        "a.txt", "b/c.jsonl line 1", "b/c.jsonl line 2", "b/c.jsonl line 3", "d.jsonl.gz line 1",
        "d.jsonl.gz line 2", *[f"e.parquet row {i}" for i in range(5)]]
    assert texts(Source(f"files:{folder}/b/*.jsonl")) == paragraphs[1:4]  # absolute


# --- bad input -----------------------------------------------------------------------------------------


def corrupt_gzip(path) -> None:
    write_jsonl(path, [{"text": np.random.default_rng(0).bytes(2000).hex()}], opener=gzip.open)
    path.write_bytes(path.read_bytes()[:300])  # cut short within its first line


BAD_FILES = {  # name: (write the bad file, what its bad record is called, fragments of the message)
    "a field missing": (lambda p: write_jsonl(p / "x.jsonl", [{"text": "ok"}, {"title": "t"}, {"text": "ok"}]),
                        "x.jsonl line 2", "has no field 'text' (its fields: title)"),
    "a number": (lambda p: write_jsonl(p / "x.jsonl", [{"text": "ok"}, {"text": 3}]),
                 "x.jsonl line 2", "field 'text' is int, not a string"),
    "a corrupt line": (lambda p: (p / "x.jsonl").write_text('{"text": "ok"}\n{"text": "cut\n'),
                       "x.jsonl line 2", "is not valid JSON"),
    "a JSON list": (lambda p: (p / "x.jsonl").write_text('{"text": "ok"}\n["text"]\n'),
                    "x.jsonl line 2", "is a JSON list, not an object"),
    "invalid UTF-8 in jsonl": (lambda p: (p / "x.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "\xff"}\n'),
                               "x.jsonl line 2", "is not UTF-8 text (invalid start byte at byte 10"),
    "invalid UTF-8 text": (lambda p: (p / "x.txt").write_bytes("fine é".encode("latin-1")),
                           "x.txt", "is not UTF-8 text"),
    "an empty text": (lambda p: (p / "x.txt").write_text(" \n"), "x.txt", "is empty"),
    "an empty jsonl": (lambda p: (p / "x.jsonl").write_text("\n"), "x.jsonl", "is empty: no JSON lines"),
    "a cut gzip": (lambda p: corrupt_gzip(p / "x.jsonl.gz"), "x.jsonl.gz line 1", "cannot be read (EOFError"),
    "a corrupt parquet": (lambda p: (p / "x.parquet").write_bytes(b"PAR1 not parquet"), "x.parquet",
                          "cannot be read as parquet"),
    "a null in parquet": (lambda p: write_parquet(p / "x.parquet", ["ok", None, "ok"]), "x.parquet row 1",
                          "field 'text' is null"),
    "no parquet column": (lambda p: write_parquet(p / "x.parquet", ["ok"], column="body"), "x.parquet",
                          "has no column 'text' (its columns: body)"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_bad_record_is_one_line_naming_the_source_file_and_record_or_is_skipped(case, tmp_path, capsys):
    """Beside good.jsonl, a file with a bad record: one UserError line naming the source, the file and the
    record; with skip_bad_records, every good document and a warning counting the one skipped."""
    write, where, problem = BAD_FILES[case]
    write_jsonl(tmp_path / "good.jsonl", [{"text": "one"}, {"text": "two"}])
    write(tmp_path)
    spec = f"files:{tmp_path}/*"
    with pytest.raises(UserError) as error:
        list(Source(spec, option="data.source"))
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"data.source={spec}: {tmp_path}/{where}"), message
    assert problem in message and "skip_bad_records=True" in message
    source = Source(spec, skip_bad_records=True, option="data.source")
    documents = texts(source)
    assert documents[:2] == ["one", "two"] and set(documents[2:]) <= {"ok"} and source.skipped == 1
    warning = capsys.readouterr().err
    assert warning.startswith(f"warning: skipped 1 bad records of data.source={spec} (the first: {tmp_path}/{where}: ")
    assert problem in warning and warning.endswith(")\n") and warning.count("\n") == 1


@pytest.mark.parametrize("spec, fragments", [
    ("corpus.jsonl", ["data.source=corpus.jsonl: use files:GLOB, tfds:"]),
    ("files:{tmp}/*.jsonl", ["no file matches", "*.jsonl"]),
    ("files:{tmp}/*", ["notes.md is not a file lm reads: use .txt, .txt.gz, .jsonl"]),
    ("tfds:no_such_dataset_zz", ["tensorflow-datasets has no dataset 'no_such_dataset_zz'"]),
    ("tfds:lm1b:train", ["the TFDS dataset lm1b is not prepared in {tmp}/tfds", "tfds build lm1b"]),
    ("hf:HuggingFaceFW/fineweb-edu:sample-10BT", ["is no local folder", "needs the network, which $LM_OFFLINE"]),
])
def test_a_source_that_cannot_be_opened_is_one_line(spec, fragments, tmp_path, monkeypatch):
    (tmp_path / "notes.md").write_text("notes")
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
    monkeypatch.setenv("LM_DATA_DIR", str(tmp_path))
    spec = spec.format(tmp=tmp_path)
    with pytest.raises(UserError) as error:
        Source(spec, option="data.source")
    assert "\n" not in str(error.value) and str(error.value).startswith(f"data.source={spec}: ")
    for fragment in fragments:
        assert fragment.format(tmp=tmp_path) in str(error.value)


def test_without_the_datasets_library_hf_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets: ImportError
    with pytest.raises(UserError, match=r"^source=hf:x: .* needs the datasets library: pip install -e \"\.\[hf\]\""):
        Source("hf:x")


# --- TFDS and Hugging Face datasets ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tfds_builder(paragraphs):
    """A TFDS builder of paragraphs 0-19 (train) and 20-24 (test), registered once as shakespeare_paragraphs."""
    import tensorflow_datasets as tfds

    class ShakespeareParagraphs(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            features = tfds.features.FeaturesDict({"text": tfds.features.Text()})
            return tfds.core.DatasetInfo(builder=self, features=features)

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(0, 20), "test": self._generate_examples(20, 25)}

        def _generate_examples(self, start, stop):
            for i in range(start, stop):
                yield i, {"text": paragraphs[i]}

    return ShakespeareParagraphs


def test_tfds_reads_a_prepared_dataset_in_a_fixed_order(tfds_builder, paragraphs, tmp_path, monkeypatch):
    """TFDS_DATA_DIR honoured; the records in index order (TFDS's own shuffle of the prepared files), every
    one once; a split and a slice of one."""
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path))
    tfds_builder(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
    documents = list(Source("tfds:shakespeare_paragraphs"))
    assert sorted(text for _, text in documents) == sorted(paragraphs[:20])
    assert documents[3][0] == f"{tmp_path}/shakespeare_paragraphs/1.0.0 train record 3"
    assert documents == list(Source("tfds:shakespeare_paragraphs:train"))  # the same order every time
    assert sorted(texts(Source("tfds:shakespeare_paragraphs:test"))) == sorted(paragraphs[20:25])
    assert texts(Source("tfds:shakespeare_paragraphs:train[:50%]")) == texts(documents[:10])
    with pytest.raises(UserError, match="has no feature 'body' .*its features: text"):
        Source("tfds:shakespeare_paragraphs", text_field="body")


def test_hf_reads_local_data_files_and_a_saved_dataset(paragraphs, tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "hf"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", [{"text": p} for p in paragraphs[:6]])
    documents = list(Source(f"hf:{folder}"))
    assert [text for _, text in documents] == paragraphs[:6] and documents[2][0] == f"{folder} train record 2"
    datasets.Dataset.from_dict({"text": paragraphs[:3], "n": [1, 2, 3]}).save_to_disk(tmp_path / "saved")
    assert texts(Source(f"hf:{tmp_path}/saved")) == paragraphs[:3]
    with pytest.raises(UserError, match=r"has no field 'body' \(its fields: text, n\)"):
        Source(f"hf:{tmp_path}/saved", text_field="body")
    (folder / "train.jsonl").write_text('{"text": "a"}\n{"text": "cut\n')  # the library parses the files as it loads
    with pytest.raises(UserError, match=r"^source=hf:\S+: the datasets library cannot load it \(.*JSON parse.*row 1"):
        Source(f"hf:{folder}")


PAIR_FIELDS = {"data.source_field": "de", "data.target_field": "en"}


def test_several_fields_give_the_tuple_of_their_texts_and_a_missing_one_names_its_option(tmp_path):
    """jsonl and parquet records as (de, en) texts in the fields' order; a record without one of them, a
    parquet file without its column or a .txt file (no fields) named with the option that sets the field."""
    records = [{"en": f"english {i}", "de": f"deutsch {i}", "id": i} for i in range(5)]
    write_jsonl(tmp_path / "a.jsonl", records[:3])
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(records[3:]), tmp_path / "b.parquet")
    pairs = [texts for _, texts in Source(f"files:{tmp_path}/*", PAIR_FIELDS)]
    assert pairs == [(r["de"], r["en"]) for r in records]
    assert texts(Source(f"files:{tmp_path}/*", {"data.target_field": "en", "data.source_field": "en"})) == [
        (r["en"], r["en"]) for r in records]  # one field twice: each its own column

    write_jsonl(tmp_path / "a.jsonl", [records[0], {"de": "nur deutsch"}])
    with pytest.raises(UserError, match=r"a.jsonl line 2: has no field 'en' \(its fields: de\): set "
                                        r"--config.data.target_field; fix or remove it"):
        list(Source(f"files:{tmp_path}/a.jsonl", PAIR_FIELDS, option="data.source"))
    write_parquet(tmp_path / "b.parquet", ["x"], column="de")  # (a parquet file lacking a column: bad as a whole)
    with pytest.raises(UserError, match=r"b.parquet: has no column 'en' \(its columns: de\): set "
                                        r"--config.data.target_field"):
        list(Source(f"files:{tmp_path}/b.parquet", PAIR_FIELDS))
    (tmp_path / "c.txt").write_text("one text")
    with pytest.raises(UserError, match=r"c.txt is one text, not records with the fields 'de', 'en': use .jsonl"):
        Source(f"files:{tmp_path}/*", PAIR_FIELDS)


def test_a_tfds_translation_dataset_gives_its_languages_as_fields(tmp_path, monkeypatch):
    """A dataset of tfds.features.Translation records (as wmt14_translate/de-en), prepared in the test: each
    record's (de, en); a language it lacks named with the option that sets it."""
    import tensorflow_datasets as tfds

    class GermanEnglishPairs(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.Translation(languages=("de", "en")))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            for i in range(4):
                yield i, {"de": f"Satz {i} über", "en": f"sentence {i}"}

    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path))
    GermanEnglishPairs(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
    assert sorted(texts(Source("tfds:german_english_pairs", PAIR_FIELDS))) == [
        (f"Satz {i} über", f"sentence {i}") for i in range(4)]
    with pytest.raises(UserError, match=r"no feature 'fr' \(its features: de, en\): set --config.data.source_field"):
        Source("tfds:german_english_pairs", {**PAIR_FIELDS, "data.source_field": "fr"})


# --- sharding over processes -----------------------------------------------------------------------------


def test_processes_read_disjoint_documents_that_cover_the_source_once(tmp_path, paragraphs):
    write_jsonl(tmp_path / "a.jsonl", [{"text": p} for p in paragraphs[:7]])
    write_jsonl(tmp_path / "b.jsonl", [{"text": p} for p in paragraphs[7:11]])
    documents = list(Source(f"files:{tmp_path}/*.jsonl"))
    for count in (1, 2, 3):
        shares = [list(shard_documents(Source(f"files:{tmp_path}/*.jsonl"), index, count)) for index in range(count)]
        assert shares == [documents[index::count] for index in range(count)]  # document i: process i % count
        places = [where for share in shares for where, _ in share]
        assert sorted(places) == sorted(where for where, _ in documents) and len(set(places)) == len(documents)
    with pytest.raises(ValueError):
        shard_documents(documents, 2, 2)


# --- the language model on a source ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(paragraphs, tmp_path_factory):
    """paragraphs as jsonl (two files) and a BPE of VOCAB ids trained on them: (folder, tokenizer.json)."""
    folder = tmp_path_factory.mktemp("corpus")
    write_jsonl(folder / "a.jsonl", [{"text": p} for p in paragraphs[:150]])
    write_jsonl(folder / "b.jsonl", [{"text": p} for p in paragraphs[150:]])
    BPETokenizer.train(paragraphs, VOCAB).save(folder / "tokenizer.json")
    return folder, folder / "tokenizer.json"


def source_config(corpus, **data):
    """The Shakespeare test config (2 layers, 32 wide, context 16) on the corpus's jsonl, packed by document."""
    from configs import base
    from configs.gpt_shakespeare import get_config

    folder, tokenizer = corpus
    config = get_config("test")
    config.data = base.token_file_data()
    config.data.update({"dataset": "source", "source": f"files:{folder}/*.jsonl", "tokenizer": str(tokenizer),
                        "vocab_size": VOCAB, "context_length": 16, "val_fraction": 0.05, **data})
    config.sample.max_new_tokens = 0
    config.eval.context_lengths = (16,)  # results.json: the val loss at the training length
    return config


def test_documents_are_tokenised_once_and_split_into_train_and_val(corpus, paragraphs, tmp_path, capsys):
    """Each document's ids then end-of-text; the last 5% of them for validation; packed rows holding every
    training token; concat: the same ids as one stream. A resumed run reads them from its data cache."""
    from experiments.language_model import build

    tokenizer = BPETokenizer.load(corpus[1])
    expected = [np.append(tokenizer.encode(p), tokenizer.end_of_text_id) for p in paragraphs]
    built = build(source_config(corpus), tmp_path)
    assert "data.source: 285 documents packed into" in capsys.readouterr().out  # 15 held out
    assert [d.tolist() for d in built.val_documents[0]] == [d.tolist() for d in expected[285:]]
    rows = built.train_rows[0]
    assert np.sort(rows.tokens[rows.segment_ids > 0]).tolist() == np.sort(np.concatenate(expected[:285])).tolist()
    concat = build(source_config(corpus, packing="concat"))
    assert concat.train_tokens.tolist() == np.concatenate(expected[:285]).tolist()
    assert concat.val_tokens.dtype == np.uint16 and len(concat.val_windows(16)) == 2  # the ids as stored
    assert concat.val_windows(16)[0]["inputs"].dtype == np.int32

    built.save_assets(tmp_path)  # the data cache, as the trainer writes it
    (corpus[0] / "b.jsonl").rename(tmp_path / "moved.jsonl")  # not read again
    try:
        resumed = build(source_config(corpus), tmp_path)
    finally:
        (tmp_path / "moved.jsonl").rename(corpus[0] / "b.jsonl")
    assert "documents: " in capsys.readouterr().out  # "documents: <cache file>, cached by an earlier run"
    np.testing.assert_array_equal(resumed.train_rows[0].tokens, rows.tokens)

    (tmp_path / "few").mkdir()
    (tmp_path / "few" / "a.txt").write_text("a single document")
    (tmp_path / "few" / "b.txt").write_text("")
    single = build(source_config(corpus, source=f"files:{tmp_path}/few/*", skip_bad_records=True, val_fraction=0.3))
    whole = np.append(tokenizer.encode("a single document"), tokenizer.end_of_text_id)
    cut = len(whole) - max(1, int(len(whole) * 0.3))  # a single document: its last 30% of tokens held out
    assert single.val_documents[0][0].tolist() == whole[cut:].tolist()
    assert single.train_rows[0].tokens[0, :cut].tolist() == whole[:cut].tolist()
    with pytest.raises(UserError, match=r"few/b.txt gives no documents: all 1 of its records are bad"):
        build(source_config(corpus, source=f"files:{tmp_path}/few/b.txt", skip_bad_records=True))


def test_the_batch_at_any_step_is_the_same_whether_resumed_there_or_reached_byte_for_byte(corpus):
    """Global batch s of a pipeline built afresh and started at s (a resumed run) equals the one reached by
    iterating from step 0, byte for byte, with one process and with two (whose rows make up the global batch);
    step 220 is past the first epoch, of 1,710 rows."""
    from experiments.language_model import build

    first, fresh = build(source_config(corpus)), build(source_config(corpus))
    step, batch_size = 220, 8
    batches = list(itertools.islice(first.train_data(batch_size, 7, (0, 1), 0), step + 1))
    whole = batches[step]
    for count in (1, 2):
        shares = []
        for index in range(count):
            reached = list(itertools.islice(first.train_data(batch_size // count, 7, (index, count), 0), step + 1))
            resumed = next(iter(fresh.train_data(batch_size // count, 7, (index, count), step)))
            assert resumed.keys() == {"inputs", "targets", "segment_ids", "positions", "weights"}
            for key, value in resumed.items():
                assert value.tobytes() == reached[step][key].tobytes() and value.dtype == reached[step][key].dtype
            shares.append(resumed)
        for key, value in whole.items():
            assert np.concatenate([share[key] for share in shares]).tobytes() == value.tobytes()
    assert any(batch["segment_ids"].max() > 1 for batch in batches)  # rows that hold several documents


@pytest.mark.parametrize("data, fragment", [
    ({"mixture": "files:a.jsonl=1"}, "needs the documents to train on: data.source .* or data.mixture .*, not both"),
    ({"source": ""}, "needs the documents to train on: data.source"),
    ({"source": "", "mixture": "files:a.jsonl=1", "packing": "concat"}, "needs data.packing=documents, not 'concat'"),
])
def test_source_and_mixture_options_that_do_not_fit_are_one_line(corpus, data, fragment):
    from experiments.language_model import build

    with pytest.raises(UserError, match=fragment):
        build(source_config(corpus, **data))


def test_a_source_or_mixture_selects_the_source_dataset_and_the_vocabulary_is_the_tokenizers(corpus):
    """configs/gpt2.py:bpe_small with data.source alone: its documents, GPT-2's tokenizer (the stated default,
    from $LM_DATA_DIR/vocab) and its 50,257 ids; with data.tokenizer, that tokenizer's vocabulary; a mixture
    selects the source dataset too. The run's config (experiment.config, what the trainer runs with and saves)
    holds what was chosen; the config given is left alone."""
    from configs.gpt2 import get_config
    from experiments.language_model import build

    folder, tokenizer = corpus
    config = get_config("bpe_small")
    config.data.update(source=f"files:{folder}/a.jsonl", context_length=16)
    built = build(config)
    d = built.config.data
    assert (d.dataset, d.tokenizer, d.vocab_size, built.vocab_size) == ("source", "gpt2", 50257, 50257)
    assert (config.data.dataset, config.data.tokenizer, config.data.vocab_size) == ("token_file", "", 0)
    config.data.update(source="", mixture=f"files:{folder}/a.jsonl=1,files:{folder}/b.jsonl=1",
                       tokenizer=str(tokenizer))
    built = build(config)
    assert (built.config.data.dataset, built.config.data.vocab_size, len(built.components)) == ("source", VOCAB, 2)


@pytest.mark.parametrize("variant, data, message", [
    ("test", {"source": "files:a.jsonl"},
     "data.source='files:a.jsonl' is not read by data.dataset='synthetic': drop it (it is for data.dataset=source)"),
    ("bpe_small", {"source": "files:a.jsonl", "train_file": "a.bin"},
     "data.train_file='a.bin' is not read by data.dataset='source': drop it (it is for data.dataset=token_file)"),
    ("bpe_small", {"packing": "concat"},
     "data.packing='concat' is not read by data.dataset='token_file': drop it (it is for data.dataset=source)"),
])
def test_a_key_the_chosen_dataset_does_not_read_stops_the_run_before_anything_is_written(variant, data, message,
                                                                                        tmp_path, capsys):
    """Only a key set away from its default: configs/gpt2.py's token-file keys at theirs do not stop a source."""
    from configs.gpt2 import get_config
    from lm.cli.resolve import build_experiment
    from lm.train.loop import train

    config = get_config(variant)
    config.data.update(data)
    with pytest.raises(SystemExit) as exit_code:
        run_user_errors(lambda: train(config, str(tmp_path / "run"), build_experiment, jax.devices()[:1]))
    assert exit_code.value.code == 2 and not (tmp_path / "run").exists()
    assert capsys.readouterr().err == f"error: {message}\n"


def test_a_bad_record_stops_lm_train_before_anything_is_written(corpus, tmp_path, capsys):
    from lm.cli.resolve import build_experiment
    from lm.train.loop import train

    (tmp_path / "data").mkdir()
    write_jsonl(tmp_path / "data" / "a.jsonl", [{"text": "ok"}, {"body": "no text"}])
    config = source_config(corpus, source=f"files:{tmp_path}/data/*.jsonl")
    with pytest.raises(SystemExit) as exit_code:
        run_user_errors(lambda: train(config, str(tmp_path / "run"), build_experiment, jax.devices()[:1]))
    assert exit_code.value.code == 2 and not (tmp_path / "run").exists()
    assert capsys.readouterr().err == (f"error: data.source=files:{tmp_path}/data/*.jsonl: {tmp_path}/data/a.jsonl "
                                       "line 2: has no field 'text' (its fields: body): set --config.data.text_field; "
                                       "fix or remove it, or pass --config.data.skip_bad_records=True to skip such "
                                       "records\n")


@pytest.mark.slow
def test_a_gpt_trains_on_a_mixture_of_jsonl_sources_packed_by_document(corpus, tmp_path, capsys):
    """A mixture of the two files, 3:1: the rows' token shares are logged, and the val loss is given for the
    mixed val rows and for each source's alone."""
    from lm.cli.resolve import build_experiment
    from lm.train.loop import train

    folder = corpus[0]
    config = source_config(corpus, source="", mixture=f"files:{folder}/a.jsonl=3,files:{folder}/b.jsonl=1")
    config.train.update(num_steps=12, log_every=4, checkpoint_every=12)
    config.eval.every = 0  # the val loss after the last step only
    summary = train(config, str(tmp_path), build_experiment, devices=jax.devices()[:1])
    out = capsys.readouterr().out
    assert f"data.mixture source0 = files:{folder}/a.jsonl (0.75): 143 documents packed into " in out  # 7 held out
    assert f"data.mixture source1 = files:{folder}/b.jsonl (0.25): 143 documents" in out and "% padding" in out
    logs = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = [log["loss"] for log in logs if "loss" in log]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0] - 0.3, losses  # from ln(300) = 5.7
    shares = np.array([[log["share_source0"], log["share_source1"]] for log in logs if "loss" in log])
    np.testing.assert_allclose(shares.sum(axis=1), 1, atol=1e-6)
    assert abs(shares[:, 0].mean() - 0.75) < 0.15, shares  # 3 logs of 4 batches of 8 rows
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["step"] == summary["step"] == 12 and results["val_cross_entropy_ctx16"] < np.log(VOCAB) - 0.3
    assert results["val_cross_entropy_source0"] < np.log(VOCAB) - 0.3
    assert results["val_cross_entropy_source1"] < np.log(VOCAB) - 0.3
    assert (tmp_path / "tokenizer.json").is_file() and list((tmp_path / "data_cache").glob("documents-*.pkl"))
