"""BERT: the WordPiece tokenizer, the model (bidirectional, the masked-LM head against numpy, published
parameter counts), the pretraining data (masking proportions, next-sentence pairs, resume) and a tiny
pretraining run end to end, with the bad-input messages."""

import gzip
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import erf

from configs.bert import get_config
from experiments import masked_lm as experiment
from lm.cli.resolve import build_experiment
from lm.data import masked_lm
from lm.data.wordpiece import SPECIAL_TOKENS, WordPieceTokenizer
from lm.errors import UserError
from lm.models.bert import Bert, BertForPretraining, bert_config, bert_options
from lm.train.loop import train

CLS, SEP, MASK, PAD = 2, 3, 4, 0  # a trained vocabulary's special ids (SPECIAL_TOKENS' order)


@pytest.fixture(scope="module")
def bert_vocab(data_dir):
    return WordPieceTokenizer.from_vocab("bert-base-uncased")


def test_bert_uncased_wordpiece(bert_vocab, tmp_path):
    text = "Héllo, unaffable WORLD!"
    ids, offsets = bert_vocab.encode_with_offsets(text)
    assert ids == [7592, 1010, 14477, 20961, 3468, 2088, 999]  # hello , una ##ffa ##ble world !
    assert bert_vocab.id_pieces(ids)[2:5] == ["una", "##ffa", "##ble"]
    assert [text[a:b] for a, b in offsets] == ["Héllo", ",", "una", "ffa", "ble", "WORLD", "!"]
    assert bert_vocab.decode([101, *ids, 102]) == "hello, unaffable world!"
    assert (bert_vocab.pad_id, bert_vocab.unk_id, bert_vocab.cls_id, bert_vocab.sep_id, bert_vocab.mask_id) == (
        0, 100, 101, 102, 103)
    assert bert_vocab.encode_pair([7, 8], [9]) == ([101, 7, 8, 102, 9, 102], [0, 0, 0, 0, 1, 1])
    assert bert_vocab.encode_batch(["hello", "world"]) == [[7592], [2088]]
    bert_vocab.save(tmp_path)
    assert WordPieceTokenizer.load(tmp_path).encode(text) == ids
    assert WordPieceTokenizer.named(str(tmp_path)).source == str(tmp_path / "tokenizer.json")  # a run's tokenizer/
    assert WordPieceTokenizer.named("bert-base-uncased").encode(text) == ids  # else a vocab.txt


def test_trained_wordpiece_and_vocabulary_checks(tmp_path):
    texts = ["the cat sat on the mat", "the dog sat on the log", "cats and dogs"] * 20
    trained = WordPieceTokenizer.train(texts, vocab_size=60)
    assert trained.id_pieces(range(5)) == list(SPECIAL_TOKENS) and trained.vocab_size <= 60
    assert trained.decode(trained.encode("The cat sat")) == "the cat sat"
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[SEP]", "the", "cat"]) + "\n")
    with pytest.raises(UserError, match=r"lacks the special tokens \[CLS\] \[MASK\]"):
        WordPieceTokenizer.from_vocab(str(vocab))
    with pytest.raises(UserError, match=r"vocabulary file /nowhere/vocab.txt not found"):
        WordPieceTokenizer.from_vocab("/nowhere/vocab.txt")


def test_wordpiece_training_gives_the_same_vocabulary_every_time(tmp_path):
    """Hugging Face's trainer alone numbers the '##' pieces, which break ties between merges of equal
    count, in hash order: the same texts gave other pieces and ids from one training to the next."""
    texts = ["Wel come to the Tok en izers libr ary.", "the cat sat on the mat", "a dog, a log; cats and dogs!",
             "Tokenizers learn pieces", "sat mat log dog"] * 3
    vocabularies = {json.dumps(WordPieceTokenizer.train(texts, vocab_size=80).tokenizer.get_vocab(), sort_keys=True)
                    for _ in range(12)}
    assert len(vocabularies) == 1
    trained = WordPieceTokenizer.train(texts, vocab_size=80)
    continuing = sorted({char for word in "wel come to the tok en izers libr ary cat sat on mat dog log cats and dogs "
                         "tokenizers learn pieces".split() for char in word[1:]})
    assert trained.id_pieces(range(5, 5 + len(continuing))) == ["##" + char for char in continuing]
    assert trained.decode(trained.encode("Welcome to the cats")) == "welcome to the cats"
    file = tmp_path / "texts.txt"
    file.write_text("\n".join(texts) + "\n")
    assert WordPieceTokenizer.train([file], vocab_size=80).tokenizer.get_vocab() == trained.tokenizer.get_vocab()


@pytest.fixture(scope="module")
def tiny_model():
    """A tiny BertForPretraining (vocabulary 50, 16 positions) and its parameters, with a nonzero
    masked-LM bias and norm bias so that the numpy comparison tests each term."""
    config = bert_config(bert_options("tiny", dropout=0.0, attention_dropout=0.0, max_positions=16), vocab_size=50)
    model = BertForPretraining(config)
    tokens = jnp.zeros((1, 16), jnp.int32)
    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), tokens, tokens, tokens == 0, tokens[:, :2])["params"])
    rng = np.random.default_rng(1)
    params["mlm_head"]["bias"] = jnp.asarray(rng.normal(size=50), jnp.float32)
    params["mlm_head"]["norm"]["LayerNorm_0"]["bias"] = jnp.asarray(rng.normal(size=64), jnp.float32)
    return model, params


def test_attention_is_bidirectional_and_ignores_padding(tiny_model):
    model, params = tiny_model
    tokens = np.random.default_rng(0).integers(5, 50, (1, 12)).repeat(3, axis=0)
    tokens[1, 9] = 5 + (tokens[0, 9] - 4) % 45  # row 1: another last real token
    tokens[2, 11] = 5 + (tokens[0, 11] - 4) % 45  # row 2: another padding token
    mask = np.arange(12)[None].repeat(3, 0) < 10  # the last two are padding
    hidden = jax.jit(Bert(model.config).apply)({"params": params["bert"]}, jnp.asarray(tokens, jnp.int32),
                                               jnp.zeros((3, 12), jnp.int32), jnp.asarray(mask))[0]
    assert float(jnp.abs(hidden[1, 0] - hidden[0, 0]).max()) > 1e-3  # the first token sees the future
    np.testing.assert_allclose(hidden[2, :10], hidden[0, :10], atol=1e-6)  # padding is never attended to


def test_masked_lm_head_matches_numpy(tiny_model):
    model, params = tiny_model
    rng = np.random.default_rng(1)
    tokens = jnp.asarray(rng.integers(5, 50, (2, 10)), jnp.int32)
    segments, mask = jnp.asarray(rng.integers(0, 2, (2, 10)), jnp.int32), jnp.ones((2, 10), bool)
    positions = jnp.asarray([[1, 4, 9], [0, 0, 5]], jnp.int32)

    @jax.jit
    def outputs(params):
        heads = model.apply({"params": params}, tokens, segments, mask, positions)
        return heads, Bert(model.config).apply({"params": params["bert"]}, tokens, segments, mask)

    (mlm_logits, nsp_logits), (hidden, pooled) = outputs(params)
    head = params["mlm_head"]
    h = np.take_along_axis(np.asarray(hidden), np.asarray(positions)[..., None], axis=1)  # (B, P, D)
    h = h @ np.asarray(head["dense"]["kernel"]) + np.asarray(head["dense"]["bias"])
    h = 0.5 * h * (1 + erf(h / np.sqrt(2)))  # exact GELU
    norm = head["norm"]["LayerNorm_0"]
    h = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-12) * norm["scale"] + norm["bias"]
    table = np.asarray(params["bert"]["embeddings"]["token_embed"]["embedding"])[:50]  # tied, padding rows cut
    np.testing.assert_allclose(mlm_logits, h @ table.T + np.asarray(head["bias"]), rtol=2e-4, atol=2e-5)
    nsp = np.asarray(pooled) @ np.asarray(params["nsp_head"]["kernel"]) + np.asarray(params["nsp_head"]["bias"])
    np.testing.assert_allclose(nsp_logits, nsp, rtol=2e-4, atol=2e-6)


def test_parameter_counts_are_bert_base_and_large():
    """Hugging Face BertModel / BertForPreTraining of bert-base-uncased and bert-large-uncased, by hand:
    embeddings V D + 512 D + 2 D + 2 D, per layer 4 (D^2 + D) + 2 (4 D^2) + 4 D + D + 4 D (the norms),
    pooler D^2 + D; pretraining heads D^2 + D + 2 D + V + 2 D + 2."""

    def counts(size):
        config = bert_config(bert_options(size, vocab_multiple=1, scan_layers=True), 30522)  # traces one layer
        tokens = jnp.zeros((1, 8), jnp.int32)
        shapes = jax.eval_shape(BertForPretraining(config).init, jax.random.key(0), tokens, tokens, tokens == 0,
                                tokens[:, :2])
        params = nn.unbox(shapes["params"])
        return sum(x.size for x in jax.tree.leaves(params["bert"])), sum(x.size for x in jax.tree.leaves(params))

    def by_hand(layers, d):
        bert = 30522 * d + 514 * d + 2 * d + layers * (4 * (d * d + d) + 8 * d * d + 5 * d + 4 * d) + d * d + d
        return bert, bert + d * d + 5 * d + 30522 + 2

    assert counts("base") == by_hand(12, 768) == (109_482_240, 110_106_428)
    assert counts("large") == by_hand(24, 1024) == (335_141_888, 336_226_108)


def numbered_documents(num_documents=80, sentences=40, length=3):
    """Sentence j of document d is `length` copies of the id 10 + 100 d + j."""
    return [[np.full(length, 10 + 100 * d + j, np.int32) for j in range(sentences)] for d in range(num_documents)]


def test_next_sentence_pairs_are_half_true_continuations():
    pairs = masked_lm.create_pairs(numbered_documents(), 32, 0.1, np.random.default_rng(0), CLS, SEP)
    assert len(pairs) > 500
    random_next = 0
    for pair in pairs:
        ids = pair.ids
        assert ids[0] == CLS and ids[pair.first_length - 1] == SEP and ids[-1] == SEP and len(ids) <= 32
        a, b = ids[1 : pair.first_length - 1], ids[pair.first_length : -1]
        assert np.all(np.diff(a) >= 0) and np.all(np.diff(a) <= 1)  # A: consecutive sentences of one document
        if pair.is_random_next:
            random_next += 1
            assert (a[-1] - 10) // 100 != (b[0] - 10) // 100  # B comes from another document
        else:
            assert b[0] == a[-1] + 1  # B is the sentence after A's last
    assert abs(random_next / len(pairs) - 0.5) < 0.06


def synthetic_pairs(count=64, length=40):
    rng = np.random.default_rng(3)
    return [masked_lm.Pair(np.asarray([CLS, *rng.integers(5, 100, length - 3), SEP, *rng.integers(5, 100, 2), SEP],
                                      np.int32), length - 1, bool(i % 2)) for i in range(count)]


MASKING = masked_lm.Masking(MASK, np.asarray([0, 1, 2, 3, 4]), np.arange(5, 100), 0.15, 20)


def test_masking_proportions_and_specials():
    pairs = synthetic_pairs()
    batches = masked_lm.train_batches(pairs, MASKING, 48, PAD, batch_size=16, seed=0)
    originals = {tuple(p.ids) for p in pairs}
    chosen = masked = randomised = kept = non_special = 0
    for batch, _ in zip(batches, range(40), strict=False):
        for row in range(16):
            weights = batch["masked_weights"][row] > 0
            positions, targets = batch["masked_positions"][row][weights], batch["masked_targets"][row][weights]
            tokens = batch["tokens"][row]
            real = batch["mask"][row]
            original = tokens.copy()
            original[positions] = targets
            assert np.isin(original[real], np.arange(5, 100)).sum() == real.sum() - 3  # [CLS] [SEP] [SEP] kept
            assert not np.isin(targets, [PAD, CLS, SEP]).any()
            assert np.all(tokens[~real] == PAD) and tuple(original[real]) in originals  # targets: the originals
            non_special += real.sum() - 3
            chosen += len(positions)
            masked += np.sum(tokens[positions] == MASK)
            kept += np.sum(tokens[positions] == targets)
            randomised += np.sum((tokens[positions] != MASK) & (tokens[positions] != targets))
    assert abs(chosen / non_special - 0.15) < 0.01
    assert abs(masked / chosen - 0.8) < 0.03
    assert abs(kept / chosen - 0.1) < 0.025 and abs(randomised / chosen - 0.1) < 0.025


def test_batches_resume_and_shard_exactly():
    pairs = synthetic_pairs()
    fresh = list(zip(masked_lm.train_batches(pairs, MASKING, 48, PAD, 8, seed=5), range(10), strict=False))
    resumed = masked_lm.train_batches(pairs, MASKING, 48, PAD, 8, seed=5, start_step=8)  # crosses an epoch
    halves = [masked_lm.train_batches(pairs, MASKING, 48, PAD, 4, seed=5, shard=(i, 2), start_step=8)
              for i in range(2)]
    for (expected, _), got, first, second in zip(fresh[8:], resumed, *halves, strict=False):
        for name in expected:
            np.testing.assert_array_equal(got[name], expected[name])
            np.testing.assert_array_equal(np.concatenate([first[name], second[name]]), expected[name])
    assert not np.array_equal(fresh[0][0]["tokens"], fresh[1][0]["tokens"])


def test_bad_input_is_one_clear_line(tmp_path, monkeypatch, data_dir):
    config = get_config("tiny")
    config.data.max_seq_len = 128  # tiny's position table has 64 rows
    with pytest.raises(UserError, match=r"data.max_seq_len=128 is longer than the position table"):
        experiment.build(config)
    config = get_config("tiny")
    config.data.vocab = "bert-base-uncased"  # and vocab_size=1000: which one?
    with pytest.raises(UserError, match=r"give one"):
        experiment.build(config)
    config = get_config("tiny")
    config.data.max_documents = -5
    with pytest.raises(UserError, match=r"data.max_documents=-5: give a count of documents per corpus file, or 0"):
        experiment.build(config)
    monkeypatch.setenv("LM_DATA_DIR", str(tmp_path))
    with pytest.raises(UserError, match=r"corpus/us_presidential_speeches.txt.gz not found .*set LM_DATA_DIR"):
        experiment.build(get_config("tiny"))
    with pytest.raises(UserError, match=r"vocab/bert-base-uncased-vocab.txt not found"):
        experiment.build(get_config("mini"))


def test_a_sources_records_are_the_documents_the_corpus_file_gives(tmp_path, monkeypatch):
    """A corpus file made jsonl as docs/data.md does (a record a document): the same documents of the same
    paragraphs, so the same held-out draw, whole or cut to data.max_documents."""
    corpus = ["First speech.  It has two sentences!\nA second \"paragraph.\" Yes.", "Short one.",
              "  Third, indented. \n\nFourth speech, after a blank line.", "Fifth.\nLast line? Yes."]
    (tmp_path / "corpus").mkdir()
    with gzip.open(tmp_path / "corpus" / "speeches.txt.gz", "wt", encoding="utf-8") as f:
        f.write("\n\n".join(corpus) + "\n")
    with gzip.open(tmp_path / "corpus" / "speeches.txt.gz", "rt", encoding="utf-8") as f:
        documents = f.read().split("\n\n")  # docs/data.md's recipe
    (tmp_path / "speeches.jsonl").write_text("".join(json.dumps({"body": d}) + "\n" for d in documents if d.strip()))
    monkeypatch.setenv("LM_DATA_DIR", str(tmp_path))
    for max_documents in (0, 3):
        data = get_config("tiny").data
        data.update(corpus=("speeches",), eval_documents=1, max_documents=max_documents)
        from_corpus = experiment.split_documents(data)
        data.update(source=f"files:{tmp_path}/speeches.jsonl", text_field="body")
        assert experiment.split_documents(data) == from_corpus
    assert sorted(sum(from_corpus, [])) == [["First speech.  It has two sentences!", 'A second "paragraph." Yes.'],
                                            ["Short one."], ["Third, indented."]]


@pytest.mark.slow
def test_tiny_pretraining_run_learns(tmp_path, data_dir):
    config = get_config("tiny")
    summary = train(config, str(tmp_path), build_experiment, devices=jax.devices()[:1])
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval_mlm_loss" in r]
    assert evals[0]["eval_mlm_loss"] == pytest.approx(np.log(1000), abs=0.1)  # uniform at initialisation
    assert summary["eval_mlm_loss"] < evals[0]["eval_mlm_loss"] - 0.7
    assert {"mlm_loss", "mlm_accuracy", "nsp_accuracy", "tokens_per_second"} <= set(records[1])
    assert WordPieceTokenizer.load(tmp_path / "tokenizer").vocab_size == 1000


@pytest.mark.slow
def test_pretraining_on_an_8_device_mesh_matches_one_device(data_dir):
    """data 2 x fsdp 2 x tensor 2: the sharded embeddings (token, position, segment), the masked-position
    gather, the tied output over the padded vocabulary and the dropout masks give one device's losses,
    step after step (the trainer's train step, its state sharded as the trainer shards it)."""
    from lm import sharding
    from lm.train.setup import build

    def losses(devices, **mesh):
        config = get_config("tiny")
        config.data.max_documents = 6
        config.model.update(num_layers=1, dropout=0.1)
        config.mesh.update(**mesh)
        setup = build(config, build_experiment, devices)
        with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
            _, shardings = setup.abstract_state()
            state, train_step = setup.init_state(shardings), setup.jit_train_step(shardings)
            batches, logged = iter(setup.train_data(0)), []
            for _ in range(3):
                batch = sharding.assemble_batch(next(batches), setup.mesh, config.train.batch_size)
                state, metrics = train_step(state, (batch,))
                logged.append([float(metrics[name][0]) for name in ("loss", "mlm_loss", "nsp_loss")])
        return np.array(logged)

    one = losses(jax.devices()[:1])
    np.testing.assert_allclose(losses(jax.devices(), data=2, fsdp=2, tensor=2), one, rtol=2e-5)
    assert one[-1, 0] < one[0, 0]  # it trains
