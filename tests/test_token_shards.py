"""`lm prepare --source`: token shards (lm/data/token_shards.py) that hold each document's ids then end-of-text,
whatever the shard size, the pieces and the workers; a resume after a kill that writes the same bytes; one-line
errors; and `data.source=tokens:DIR` giving the language model the same documents, nothing tokenised."""

import json

import numpy as np
import pytest
from test_cli import assert_user_error, main_in_process, snapshot

from lm.cli import prepare as prepare_cli
from lm.data import token_shards
from lm.data.bpe import BPETokenizer
from lm.errors import UserError

VOCAB = 300
TEXTS = [f"Doc {i}: caf\u00e9 \u65e5\u672c {'word ' * (i * 7 % 23)}\nline two.\n\n  indented {i * 31}\t\n"
         + ("a longer line of text, with words.\n" * 40 if i % 9 == 0 else "") for i in range(30)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """TEXTS as jsonl (a.jsonl: 30 documents, b.jsonl: 5 more) and a BPE trained on them: (folder, tokenizer)."""
    folder = tmp_path_factory.mktemp("corpus")
    (folder / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    (folder / "b.jsonl").write_text("".join(json.dumps({"text": t[::-1]}) + "\n" for t in TEXTS[:5]))
    tokenizer = BPETokenizer.train(TEXTS, VOCAB)
    tokenizer.save(folder / "tokenizer.json")
    return folder, tokenizer


@pytest.fixture(autouse=True)
def small_tasks(monkeypatch):
    """Pieces of about 50 characters in tasks of about 300: the long documents are cut, tasks end mid-document."""
    monkeypatch.setattr(token_shards, "PIECE_CHARACTERS", 50)
    monkeypatch.setattr(token_shards, "TASK_CHARACTERS", 300)


def prepare(corpus, out, **arguments) -> dict:
    folder, _ = corpus
    arguments = {"spec": f"files:{folder}/a.jsonl", "tokenizer_name": str(folder / "tokenizer.json"),
                 "vocab_size": None, "out": str(out), "workers": 1, **arguments}
    return prepare_cli.prepare_source(**arguments)


def encoded(tokenizer: BPETokenizer, texts: list[str]) -> list[list[int]]:
    return [[*tokenizer.encode(text).tolist(), tokenizer.end_of_text_id] for text in texts]


def split_documents(folder, split) -> list[list[int]]:
    meta = json.loads((folder / "meta.json").read_text())
    ids, offsets = token_shards.read_split(folder, meta, split)
    return [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:], strict=True)]


def files(folder) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def test_shards_hold_each_document_then_end_of_text_whatever_the_shard_size(corpus, tmp_path):
    """The last 10% of the documents (3 of 30) are the val split; shards of 40 ids (each closed after the
    document that reaches 40) hold the same documents as one shard; each .idx is the shard's document starts."""
    _, tokenizer = corpus
    expected = encoded(tokenizer, TEXTS)
    meta = prepare(corpus, tmp_path / "one", val_fraction=0.1)
    assert meta["complete"] and meta["token_dtype"] == "uint16"
    assert [len(meta["splits"][split]["shards"]) for split in ("train", "val")] == [1, 1]
    assert split_documents(tmp_path / "one", "train") == expected[:27]
    assert split_documents(tmp_path / "one", "val") == expected[27:]

    meta = prepare(corpus, tmp_path / "many", val_fraction=0.1, shard_tokens=40)
    shards = meta["splits"]["train"]["shards"]
    assert len(shards) > 5 and [shard["name"] for shard in shards[:2]] == ["train-00000", "train-00001"]
    for shard in shards:
        starts = np.fromfile(tmp_path / "many" / f"{shard['name']}.idx", "<u8")
        assert starts[0] == 0 and starts[-1] == shard["tokens"] == (tmp_path / "many" / f"{shard['name']}.bin").stat(
            ).st_size // 2
        assert shard is shards[-1] or starts[-2] < 40 <= starts[-1]  # closed by the document that reached 40
    assert split_documents(tmp_path / "many", "train") == expected[:27]
    assert split_documents(tmp_path / "many", "val") == expected[27:]


def test_a_tokenizer_that_could_split_differently_encodes_documents_whole(corpus, tmp_path):
    """A pre-tokenizer with a prefix space would give a piece cut out of a document other ids: such a
    tokenizer's documents are encoded whole (bpe.splits_exactly)."""
    from tokenizers import pre_tokenizers

    folder, tokenizer = corpus
    spaced = BPETokenizer.load(folder / "tokenizer.json")
    spaced.tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    spaced.save(tmp_path / "spaced.json")
    prepare(corpus, tmp_path / "out", tokenizer_name=str(tmp_path / "spaced.json"))
    assert split_documents(tmp_path / "out", "train") == encoded(spaced, TEXTS)[:29]
    assert encoded(spaced, TEXTS) != encoded(tokenizer, TEXTS)


@pytest.mark.parametrize("killed", ["before its shard is recorded", "after its shard is recorded"])
def test_a_rerun_after_a_kill_resumes_and_writes_the_same_bytes(corpus, tmp_path, monkeypatch, killed):
    whole = tmp_path / "whole"
    prepare(corpus, whole, shard_tokens=40)
    save_meta = token_shards.save_meta

    def killed_at_the_third_shard(folder, meta):
        third = len(meta["splits"]["train"]["shards"]) == 3
        if third and killed.startswith("before"):
            raise KeyboardInterrupt
        save_meta(folder, meta)
        if third:
            (folder / "train-00003.bin.partial").write_bytes(b"half a shard")
            raise KeyboardInterrupt

    monkeypatch.setattr(token_shards, "save_meta", killed_at_the_third_shard)
    with pytest.raises(KeyboardInterrupt):
        prepare(corpus, tmp_path / "resumed", shard_tokens=40)
    monkeypatch.setattr(token_shards, "save_meta", save_meta)
    meta = json.loads((tmp_path / "resumed" / "meta.json").read_text())
    assert len(meta["splits"]["train"]["shards"]) == (2 if killed.startswith("before") else 3)
    prepare(corpus, tmp_path / "resumed", shard_tokens=40)
    assert files(tmp_path / "resumed") == files(whole)


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # (JAX's, where earlier tests ran it: the workers do not)
def test_two_workers_write_what_one_does(corpus, tmp_path):
    prepare(corpus, tmp_path / "one", shard_tokens=100)
    prepare(corpus, tmp_path / "two", shard_tokens=100, workers=2)
    assert files(tmp_path / "two") == files(tmp_path / "one")


def test_a_val_source_and_a_single_document_source(corpus, tmp_path):
    """--val_source: its documents are the val split. A source of one document: its last tokens are the val
    split's document, the rest the train split's, as the language model's held_out cuts it; a BPE trained."""
    from experiments.language_model import held_out

    folder, tokenizer = corpus
    prepare(corpus, tmp_path / "val_source", val_spec=f"files:{folder}/b.jsonl")
    assert split_documents(tmp_path / "val_source", "train") == encoded(tokenizer, TEXTS)
    assert split_documents(tmp_path / "val_source", "val") == encoded(tokenizer, [t[::-1] for t in TEXTS[:5]])

    (tmp_path / "one.txt").write_text(TEXTS[0])
    prepare(corpus, tmp_path / "single", spec=f"files:{tmp_path}/one.txt", val_fraction=0.3, tokenizer_name="bpe",
            vocab_size=280)
    trained = BPETokenizer.load(tmp_path / "single" / "tokenizer.json")
    assert trained.vocab_size == 280
    ids = np.array(encoded(trained, [TEXTS[0]])[0])
    (train, _), (val, _) = held_out((ids, np.array([0, len(ids)])), 0.3)
    assert split_documents(tmp_path / "single", "train") == [train.tolist()]
    assert split_documents(tmp_path / "single", "val") == [val.tolist()]


@pytest.mark.parametrize("args, fragments", [
    (["--source=files:{a}", "--text={a}"], ["--text and --source: give one of them"]),
    (["--source=files:{a}", "--val_fraction=0.1", "--val_source=files:{a}"], ["--val_fraction=0.1 and --val_source"]),
    (["--source=files:{a}", "--workers=0"], ["--workers=0: give 1 or more"]),
    (["--text={a}", "--workers=2", "--tokenizer=gpt2"], ["--workers: for --source, not --text"]),
    (["--source=files:{a}", "--tokenizer=/nowhere/tokenizer.json"], ["--tokenizer=/nowhere/tokenizer.json", "gpt2"]),
    (["--source=files:{bad}"], ["bad.jsonl line 2", "pass --skip_bad_records to skip"]),
])
def test_bad_input_is_one_line_and_writes_nothing(corpus, tmp_path, capsys, args, fragments):
    folder, _ = corpus
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"text": 7}\n')
    args = [a.format(a=folder / "a.jsonl", bad=tmp_path / "bad.jsonl") for a in args]
    tokenizer = [] if any(a.startswith("--tokenizer") for a in args) else [f"--tokenizer={folder / 'tokenizer.json'}"]
    result = main_in_process(capsys, prepare_cli, *args, *tokenizer, f"--out={tmp_path / 'out'}",
                             f"--workdir={tmp_path}")
    assert_user_error(result, *fragments)
    assert not (tmp_path / "out").exists()


def test_other_arguments_into_a_prepared_folder_are_one_line_and_change_nothing(corpus, tmp_path, capsys):
    folder, _ = corpus
    args = [f"--source=files:{folder}/a.jsonl", f"--tokenizer={folder / 'tokenizer.json'}", f"--out={tmp_path / 'out'}",
            "--workers=1", f"--workdir={tmp_path}"]
    first = main_in_process(capsys, prepare_cli, *args)
    assert first.returncode == 0 and "--config.data.source=tokens:" in first.stdout
    before = snapshot(tmp_path / "out")
    again = main_in_process(capsys, prepare_cli, *args, "--shard_tokens=64")
    assert_user_error(again, "was prepared with other arguments (--shard_tokens=64, not 67108864)")
    assert snapshot(tmp_path / "out") == before


def test_a_token_folder_is_a_source_of_the_language_model(corpus, tmp_path, capsys):
    """data.source=tokens:DIR: its train documents packed, its val documents for evaluation, nothing tokenised;
    another tokenizer, a folder not finished, or a val_source to tokenise beside it are one-line errors."""
    from configs import base
    from configs.gpt_shakespeare import get_config
    from experiments.language_model import build

    folder, tokenizer = corpus
    prepare(corpus, tmp_path / "shards", shard_tokens=100, val_fraction=0.1)
    config = get_config("test")
    config.data = base.token_file_data()
    config.data.update(dataset="source", source=f"tokens:{tmp_path / 'shards'}",
                       tokenizer=str(folder / "tokenizer.json"), vocab_size=VOCAB, context_length=16)
    config.sample.max_new_tokens = 0
    built = build(config, tmp_path / "run")
    assert "data.source: 27 documents packed into" in capsys.readouterr().out
    expected = encoded(tokenizer, TEXTS)
    assert [d.tolist() for d in built.val_documents[0]] == expected[27:]
    rows = built.train_rows[0]
    assert sorted(rows.tokens[rows.segment_ids > 0].tolist()) == sorted(sum(expected[:27], []))
    assert not (tmp_path / "run" / "data_cache").exists()

    def changed(**data):
        copy = config.copy_and_resolve_references()
        copy.data.update(data)
        return copy

    BPETokenizer.train(TEXTS[:3], VOCAB).save(tmp_path / "other.json")
    with pytest.raises(UserError, match=r"data.tokenizer=.*other.json is not the tokenizer .*shards was prepared with"):
        build(changed(tokenizer=str(tmp_path / "other.json")))
    with pytest.raises(UserError, match=r"give all of them as tokens:DIR .* or none"):
        build(changed(val_source=f"files:{folder}/b.jsonl"))
    meta = json.loads((tmp_path / "shards" / "meta.json").read_text())
    (tmp_path / "shards" / "meta.json").write_text(json.dumps({**meta, "complete": False}))
    with pytest.raises(UserError, match=r"lm prepare has not finished .*shards \(\d+ shards so far\)"):
        build(config)
