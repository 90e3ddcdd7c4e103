"""Byte-level BPE (lm.data.bpe) and text-level GPT: GPT-2 BPE and BERT WordPiece (lm.data.wordpiece) ids
equal to Hugging Face transformers' on fixture sentences (tests/fixtures/tokenizers/ids.json, written by
make_fixtures.py there), a trained BPE that round-trips any text, `lm prepare`'s token files, and
prepare -> train -> sample end to end."""

import json
import math
import pathlib

import numpy as np
import pytest
from test_cli import assert_user_error, main_in_process

from lm.cli import prepare as prepare_cli
from lm.cli import sample as sample_cli
from lm.cli.resolve import build_experiment
from lm.data import bpe
from lm.data.tokens import TOKEN_DTYPES
from lm.errors import UserError

FIXTURES = json.loads((pathlib.Path(__file__).parent / "fixtures" / "tokenizers" / "ids.json").read_text("utf-8"))
UNICODE = ("Caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001f600\U0001f44d\U0001f3fd \u0645\u0631\u062d\u0628\u0627 "
           "e\u0301\t\ttabs  \n\n\r\n  spaces 3.14159 1,000 it's <|endoftext|> \x00\x7f end")
CORPUS = "".join(f"ROMEO {i}: But, soft! what light through yonder window breaks? Caf\u00e9 \u00fcber alles.\n"
                 f"JULIET: It is the east, and Juliet is the sun. \u65e5\u672c {i * 7}\n\n" for i in range(60))


@pytest.fixture(scope="module")
def gpt2(data_dir):
    return bpe.BPETokenizer.from_gpt2()


@pytest.fixture(scope="module")
def trained():
    return bpe.BPETokenizer.train([CORPUS], vocab_size=320)


def test_gpt2_ids_equal_transformers(gpt2):
    assert gpt2.vocab_size == 50257 and gpt2.end_of_text_id == 50256
    for case in FIXTURES["cases"]:
        ids = gpt2.encode(case["text"])
        assert ids.dtype == np.int32 and ids.tolist() == case["gpt2"], case["text"]
        assert gpt2.decode(ids) == case["text"]


def test_bert_wordpiece_ids_equal_transformers(data_dir):
    from lm.data.wordpiece import WordPieceTokenizer

    wordpiece = WordPieceTokenizer.from_vocab("bert-base-uncased")
    assert wordpiece.vocab_size == 30522
    for case in FIXTURES["cases"]:
        ids = wordpiece.encode(case["text"])
        assert ids == case["bert_uncased"], case["text"]
        assert wordpiece.id_pieces(ids) == case["bert_uncased_pieces"], case["text"]


def test_trained_bpe_round_trips_any_text(trained, tmp_path):
    assert trained.vocab_size == 320 and trained.end_of_text_id == 0
    corpus_ids = trained.encode(CORPUS)
    assert len(corpus_ids) < len(CORPUS.encode()) / 2  # the merges compress the text they were learnt on
    every_byte = "".join(map(chr, range(0x300))) + "\u4e2d\u6587\U0001f680\ufffd"
    for text in (CORPUS, UNICODE, every_byte, ""):
        ids = trained.encode(text)
        assert ids.min(initial=0) >= 0 and ids.max(initial=0) < trained.vocab_size
        assert trained.decode(ids) == text
    assert trained.encode("a<|endoftext|>b").tolist() == [*trained.encode("a"), 0, *trained.encode("b")]
    trained.save(tmp_path / "tokenizer.json")
    loaded = bpe.BPETokenizer.load(tmp_path / "tokenizer.json")
    np.testing.assert_array_equal(loaded.encode(UNICODE), trained.encode(UNICODE))
    with pytest.raises(UserError, match="vocab_size=200 is too small for a byte-level BPE: it needs at least 257"):
        bpe.BPETokenizer.train([CORPUS], vocab_size=200)
    with pytest.raises(UserError, match="cannot load the tokenizer .*missing.json"):
        bpe.BPETokenizer.load(tmp_path / "missing.json")


def test_the_byte_tokenizer_has_an_id_a_byte_as_a_bpe_trained_on_nothing(tmp_path):
    """bytes_only (data.tokenizer=bytes): <|endoftext|> 0 and the 256 bytes, numbered as train([], 257) numbers
    them, no merges: every text round-trips, one id a UTF-8 byte."""
    tokenizer = bpe.BPETokenizer.bytes_only()
    assert tokenizer.vocab_size == 257 and tokenizer.end_of_text_id == 0
    assert tokenizer.tokenizer.to_str() == bpe.BPETokenizer.train([], 257).tokenizer.to_str()
    assert sorted(tokenizer.tokenizer.get_vocab().values()) == list(range(257))
    every_byte = "".join(map(chr, range(0x300))) + "\u4e2d\u6587\U0001f680\ufffd"
    for text in (CORPUS, UNICODE, every_byte, "123+45", ""):
        ids = tokenizer.encode(text)
        end_of_text = bpe.END_OF_TEXT in text  # its 13 characters are one id
        assert len(ids) == len(text.encode()) - 12 * text.count(bpe.END_OF_TEXT) and (0 in ids) == end_of_text
        assert tokenizer.decode(ids) == text
    assert tokenizer.encode("12+3").tolist() == [17, 18, 11, 19]


def read_ids(folder: pathlib.Path, meta: dict) -> tuple[np.ndarray, np.ndarray]:
    dtype = TOKEN_DTYPES[meta["token_dtype"]]
    return np.fromfile(folder / "train.bin", dtype), np.fromfile(folder / "val.bin", dtype)


def test_prepare_writes_token_files_that_decode_to_the_texts(tmp_path, data_dir, gpt2, monkeypatch):
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text(CORPUS, encoding="utf-8")
    second.write_text(UNICODE, encoding="utf-8")
    meta = prepare_cli.prepare([str(tmp_path / "*.txt")], "bpe", 300, str(tmp_path / "bpe"), val_fraction=0.25)
    folder = tmp_path / "bpe"
    tokenizer = bpe.BPETokenizer.load(folder / "tokenizer.json")
    assert meta == json.loads((folder / "meta.json").read_text())
    assert meta["vocab_size"] == tokenizer.vocab_size == 300 and meta["token_dtype"] == "uint16"
    assert meta["texts"] == [str(first), str(second)]
    train, val = read_ids(folder, meta)
    assert (len(train), len(val)) == (meta["train_tokens"], meta["val_tokens"])
    assert len(val) == round(0.25 * (len(train) + len(val)))
    assert tokenizer.decode(np.concatenate([train, val])) == CORPUS + "<|endoftext|>" + UNICODE
    # GPT-2's files: the same ids as its tokenizer; past 65,536 ids the files hold uint32.
    monkeypatch.setattr(prepare_cli, "UINT16_IDS", 50_000)
    meta = prepare_cli.prepare([str(second)], "gpt2", None, str(tmp_path / "gpt2"), val_fraction=0.5)
    assert meta["vocab_size"] == 50257 and meta["token_dtype"] == "uint32"
    assert (tmp_path / "gpt2" / "train.bin").stat().st_size == 4 * meta["train_tokens"]
    np.testing.assert_array_equal(np.concatenate(read_ids(tmp_path / "gpt2", meta)), gpt2.encode(UNICODE))


@pytest.mark.parametrize("args, fragments", [
    (["--text=/nowhere/input.txt", "--vocab_size=300"], ["--text=/nowhere/input.txt: file not found"]),
    (["--text={text}", "--vocab_size=100"], ["vocab_size=100 is too small", "at least 257"]),
    (["--text={text}"], ["--tokenizer=bpe needs --vocab_size"]),
    (["--text={text}", "--tokenizer=gpt2", "--vocab_size=300"], ["GPT-2's vocabulary is fixed", "drop --vocab_size"]),
    (["--text={text}", "--tokenizer=wordpeace", "--vocab_size=300"], ["--tokenizer", "bpe", "gpt2"]),
    (["--text={text}", "--vocab_size=300", "--val_fraction=1.5"], ["--val_fraction=1.5: must be between 0 and 1"]),
])
def test_prepare_bad_input_is_one_line(tmp_path, capsys, args, fragments):
    text = tmp_path / "input.txt"
    text.write_text(CORPUS)
    out = tmp_path / "out"
    # (--workdir: `lm sample`'s flag, defined in this process too, is required; prepare ignores it)
    result = main_in_process(capsys, prepare_cli, *(a.format(text=text) for a in args), f"--out={out}",
                             f"--workdir={tmp_path}")
    assert_user_error(result, *fragments)
    assert not out.exists()


def test_a_token_file_tokenizer_must_match_the_vocabulary(tmp_path, trained):
    from configs.gpt2 import get_config
    from experiments.language_model import build

    trained.save(tmp_path / "tokenizer.json")
    config = get_config("test")
    config.data.update(tokenizer=str(tmp_path / "tokenizer.json"))
    with pytest.raises(UserError, match="data.tokenizer='.*' is not read by data.dataset='synthetic': drop it "
                                        r"\(it is for data.dataset=token_file or source\)"):
        build(config)
    np.arange(100, dtype="<u2").tofile(tmp_path / "ids.bin")
    config.data.update(dataset="token_file", train_file=str(tmp_path / "ids.bin"), val_file=str(tmp_path / "ids.bin"))
    with pytest.raises(UserError, match="data.vocab_size=500 but data.tokenizer=.* has 320 ids: set "
                                        "--config.data.vocab_size=320"):
        build(config)
    config.data.update(tokenizer=str(tmp_path / "none.json"))
    with pytest.raises(UserError, match="none.json not found .*data.tokenizer.*lm prepare"):
        build(config)


def test_a_prompt_of_no_tokens_is_refused_when_the_experiment_is_built(tmp_path, trained):
    from configs.gpt2 import get_config
    from experiments.language_model import build

    trained.save(tmp_path / "tokenizer.json")
    np.arange(100, dtype="<u2").tofile(tmp_path / "ids.bin")
    config = get_config("test")
    config.data.update(dataset="token_file", train_file=str(tmp_path / "ids.bin"), val_file=str(tmp_path / "ids.bin"),
                       tokenizer=str(tmp_path / "tokenizer.json"), vocab_size=320)
    config.sample.update(prompt="", max_new_tokens=8)  # (with no sample asked for, the prompt goes unchecked)
    with pytest.raises(UserError, match="sample.prompt='': it encodes to no token ids.*--config.sample.prompt="):
        build(config)
    config.sample.prompt = "\n"
    assert build(config).tokenizer.encode("\n").size == 1


@pytest.mark.slow
def test_prepare_train_and_sample_text(tmp_path, capsys, data_dir):
    """The documented path on a tiny scale: prepare a BPE, train configs/gpt2.py on the token files with
    their tokenizer, then `lm sample` prints text."""
    import jax

    from configs.gpt2 import get_config
    from lm.train.loop import train

    corpus = tmp_path / "input.txt"
    corpus.write_text(CORPUS)
    meta = prepare_cli.prepare([str(corpus)], "bpe", 300, str(tmp_path / "data"))
    config = get_config("test")
    folder = tmp_path / "data"
    config.data.update(dataset="token_file", train_file=str(folder / "train.bin"), val_file=str(folder / "val.bin"),
                       tokenizer=str(folder / "tokenizer.json"), vocab_size=meta["vocab_size"], context_length=16)
    config.train.update(num_steps=4, log_every=2, checkpoint_every=4)
    config.eval.update(every=4, num_batches=1)
    config.model.update(num_layers=1, scan_layers=False, loss_chunk=0)  # the quickest to compile
    config.sample.update(max_new_tokens=0)
    workdir = tmp_path / "run"
    summary = train(config, str(workdir), build_experiment, devices=jax.devices()[:1])
    capsys.readouterr()  # the training log
    assert summary["step"] == 4 and math.isfinite(summary["eval_loss"])
    assert (workdir / "tokenizer.json").read_text() == (folder / "tokenizer.json").read_text()
    sampled = main_in_process(capsys, sample_cli, f"--workdir={workdir}", "--prompt=ROMEO \u00fc", "--max_new_tokens=6")
    assert sampled.returncode == 0, sampled.stderr[-2000:]
    text = sampled.stdout.rstrip("\n")
    assert text.startswith("ROMEO \u00fc") and len(text) > len("ROMEO \u00fc")  # each new id is at least a byte
    empty = main_in_process(capsys, sample_cli, f"--workdir={workdir}", "--prompt=")
    assert_user_error(empty, "--prompt='': it encodes to no token ids")
