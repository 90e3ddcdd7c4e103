"""Hugging Face checkpoints in and out (lm/hf): the fixtures of tests/fixtures/hf (made by transformers
with make_fixtures.py, which also checks lm's export in transformers) give transformers' outputs in lm,
in either layer layout, from fp32, bf16 and sharded folders; lm -> HF -> lm is exact (a BERT run's
WordPiece vocabulary too); greedy generation matches transformers' token for token; what lm cannot represent
is one line."""

import json
import os
import pathlib
import shutil
import string
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import traverse_util
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from safetensors.numpy import load_file, save_file
from tokenizers import models

from experiments.image_classification import ImageClassification
from experiments.language_model import LanguageModel
from lm.cli.resolve import build_experiment
from lm.data.wordpiece import SPECIAL_TOKENS, UNK, WordPieceTokenizer, bert_pipeline
from lm.decode.generate import generate, sample_logits
from lm.errors import UserError
from lm.hf.export import export
from lm.hf.files import Folder
from lm.hf.source import HFSource, following
from lm.models.bert import BertForPretraining, bert_config
from lm.train import init_from

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "hf"
TOLERANCE = 1e-4


EXPERIMENTS = {"GPT2": "language_model", "Llam": "language_model", "ViTF": "image_classification",
               "ViTM": "image_classification", "Bert": "masked_lm"}  # by the architecture's first 4 letters


def base_config(experiment: str) -> ml_collections.ConfigDict:
    """The test config of the experiment, fp32, that a fixture's fields are set into."""
    if experiment == "masked_lm":
        from configs.bert import get_config

        config = get_config("tiny")
    elif experiment == "language_model":
        from configs.gpt2 import get_config

        config = get_config("test")
        config.data.context_length = 24
    else:
        from configs.vit_cifar10 import get_config

        config = get_config("test")
        config.model.update(pool="cls", position="learned")
    config.model.compute_dtype = "float32"
    return config


def architecture(folder: pathlib.Path) -> str:
    return json.loads((folder / "config.json").read_text())["architectures"][0]


def load(folder: pathlib.Path, scan_layers: bool = False):
    """(config, experiment, params, plan): the fixture loaded by init_from=hf:folder into a model of the
    test config whose fields follow its config.json, on one device."""
    experiment_name = EXPERIMENTS[architecture(folder)[:4]]
    config = following(str(folder), base_config(experiment_name))
    config.model.scan_layers = scan_layers
    config.init_from = f"hf:{folder}"
    if experiment_name == "masked_lm":  # (MaskedLM wants a tokenizer: the model alone is enough here)
        model = BertForPretraining(bert_config(config.model, json.loads((folder / "config.json").read_text())[
            "vocab_size"]))
        tokens = jnp.zeros((1, 8), jnp.int32)
        experiment = types.SimpleNamespace(model=model, init=lambda rng: model.init(rng, tokens, tokens, tokens == 0,
                                                                                   tokens[:, :2]))
    elif experiment_name == "language_model":
        experiment = LanguageModel(config, None)
    else:
        experiment = ImageClassification(config)
    abstract = nn.unbox(jax.eval_shape(experiment.init, jax.random.key(0))["params"])
    fresh = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), abstract)  # (what is not loaded stays zero)
    mesh = Mesh(np.array(jax.devices()[:1]), ("devices",))
    shardings = jax.tree.map(lambda _: NamedSharding(mesh, PartitionSpec()), fresh)
    plan = init_from.prepare(config.init_from, "", abstract, None, config)
    return config, experiment, plan.load(fresh, shardings, mesh), plan


def lm_outputs(experiment, params, arrays: dict, architecture: str) -> np.ndarray:
    """lm's counterpart of the fixture's `expected`: logits, or ViTModel's last hidden state (the
    encoder's output, after its final norm)."""
    variables = {"params": params}
    if "segments" in arrays:  # BERT: masked-LM logits at every position, or BertModel's pooled output
        ids, segments, mask = (jnp.asarray(arrays[k], jnp.int32) for k in ("ids", "segments", "mask"))
        everywhere = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
        if architecture == "BertModel":
            return np.asarray(jax.jit(lambda v: experiment.model.apply(v, ids, segments, mask.astype(bool),
                                                                       method=lambda m, *a: m.bert(*a)[1]))(variables))
        return np.asarray(jax.jit(experiment.model.apply)(variables, ids, segments, mask.astype(bool), everywhere)[0])
    if "ids" in arrays:
        return np.asarray(jax.jit(experiment.model.apply)(variables, jnp.asarray(arrays["ids"], jnp.int32)))
    images = jnp.asarray(arrays["pixel_values"].transpose(0, 2, 3, 1))  # (B, C, H, W) -> (B, H, W, C)
    if architecture != "ViTModel":
        return np.asarray(jax.jit(experiment.model.apply)(variables, images))

    def encoder_output(variables, images):
        _, state = experiment.model.apply(variables, images, capture_intermediates=lambda m, _: m.name == "encoder")
        return state["intermediates"]["encoder"]["__call__"][0]

    return np.asarray(jax.jit(encoder_output)(variables, images))


@pytest.fixture(scope="module")
def loaded():
    """Each fixture loaded once per layout, on demand."""
    cache = {}

    def get(name: str, scan_layers: bool = False):
        if (name, scan_layers) not in cache:
            cache[name, scan_layers] = load(FIXTURES / name, scan_layers)
        return cache[name, scan_layers]

    return get


@pytest.mark.parametrize("name, scan_layers", [
    ("gpt2", False), ("llama", False), ("llama", True), ("llama_bf16_sharded", True),
    ("vit", False), ("vit_model", True), ("bert", False), ("bert_model", True),
])
def test_outputs_match_transformers(loaded, name, scan_layers, capsys):
    """GPT-2 (an MLP of 48, a vocabulary of 131), Llama (4 heads on 2 key/value heads, an untied head, 150
    tokens, rope_theta 500), from fp32 and from bf16 shards, ViT and ViTModel: transformers' fp32 outputs."""
    config, experiment, params, plan = loaded(name, scan_layers)
    arrays = dict(np.load(FIXTURES / name / "expected.npz"))
    np.testing.assert_allclose(lm_outputs(experiment, params, arrays, architecture(FIXTURES / name)),
                               arrays["expected"], atol=TOLERANCE, rtol=0)
    initialised = {"vit_model": ["head/bias", "head/kernel"],  # ViTModel has no classifier,
                   "bert": ["bert/pooler/bias", "bert/pooler/kernel", "nsp_head/bias", "nsp_head/kernel"],
                   "bert_model": [name for name in plan.initialised if name.split("/")[0] in ("mlm_head", "nsp_head")],
                   }.get(name, [])  # BertForMaskedLM no pooler, neither has the next-sentence head
    assert plan.initialised == initialised and plan.dropped == []


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_greedy_generation_matches_transformers(loaded, name):
    _, experiment, params, _ = loaded(name)
    arrays = np.load(FIXTURES / name / "expected.npz")
    prompt, expected = arrays["prompt"], arrays["greedy"]
    tokens = generate(experiment.model, params, prompt.astype(np.int32), expected.shape[1] - prompt.shape[1],
                      jax.random.key(0), temperature=0.0, top_k=40, top_p=0.9)
    np.testing.assert_array_equal(tokens, expected)


def test_top_p_keeps_the_smallest_set_of_most_likely_tokens_that_reaches_p():
    """Against numpy: tokens sorted by probability are kept while the mass ranked above them is < p."""
    logits = np.array([[2.0, 1.0, 0.5, 0.0, -1.0], [0.1, 3.0, -0.2, 1.0, 0.4]], np.float32)  # no ties
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    for top_p in (0.6, 0.95, 1.0):
        draws = jax.vmap(lambda key, p=top_p: sample_logits(jnp.asarray(logits), key, 1.0, 0, p))(
            jax.random.split(jax.random.key(0), 500))  # (500, 2)
        for row in range(2):
            order = np.argsort(-probs[row])
            above = np.cumsum(probs[row][order]) - probs[row][order]
            assert set(np.asarray(draws[:, row]).tolist()) == set(order[above < top_p].tolist()), (top_p, row)


def flat_params(params: dict) -> dict:
    return traverse_util.flatten_dict(params, sep="/")


def without_padding(name: str, value, vocab_size: int):
    """The vocabulary's rows of a token table or output kernel (the padding rows come back as zeros)."""
    return {"token_embed/embedding": lambda: value[:vocab_size], "lm_head/kernel": lambda: value[:, :vocab_size],
            "bert/embeddings/token_embed/embedding": lambda: value[:vocab_size]}.get(name, lambda: value)()


def test_lm_to_hf_to_lm_is_exact_from_either_layout_into_shards(loaded, tmp_path):
    """A scanned Llama and an unrolled GPT-2 (shifted off the fixture, so nothing is read back from it),
    exported in shards of at most 40 KB and imported again: the same arrays; the GPT-2 export holds the
    names and shapes transformers saved."""
    for name, scan_layers in (("llama", True), ("gpt2", False)):
        config, _, params, _ = loaded(name, scan_layers)
        params = jax.tree.map(lambda p: p + 1.0, params)
        out = tmp_path / name
        architecture_name, files = export(config, params, config.data.vocab_size, out, max_shard_bytes=40_000)
        assert len(files) > 3 and "model.safetensors.index.json" in files
        config.init_from = f"hf:{out}"
        source = HFSource(str(out), config)
        reloaded = source.load_params(jax.tree.map(lambda _: jax.devices()[0], source.abstract_params()))
        reloaded = init_from.in_layout_of(reloaded, params)
        assert flat_params(reloaded).keys() == flat_params(params).keys()
        for key, value in flat_params(params).items():
            np.testing.assert_array_equal(without_padding(key, flat_params(reloaded)[key], config.data.vocab_size),
                                          without_padding(key, value, config.data.vocab_size), err_msg=key)
    theirs = {name: value.shape for name, value in Folder(FIXTURES / "gpt2", "").abstract().items()}
    theirs["transformer.wpe.weight"] = (config.data.context_length, 32)  # the rows this run trains on
    assert {name: value.shape for name, value in Folder(tmp_path / "gpt2", "").abstract().items()} == theirs


WORDS = ("the of and to in is was he that it for on with as his by at from this be are model text we had not but "
         "have one all were they").split()


def wordpiece_of_size(size: int) -> WordPieceTokenizer:
    """A BERT uncased WordPiece vocabulary of exactly size pieces (the BERT fixtures' 140): the specials,
    the letters and digits, their '##' continuations, then common words."""
    characters = string.ascii_lowercase + string.digits
    pieces = [*SPECIAL_TOKENS, *string.punctuation, *characters, *(f"##{c}" for c in characters), *WORDS]
    assert len(set(pieces)) == len(pieces) >= size
    vocab = {piece: i for i, piece in enumerate(pieces[:size])}
    return WordPieceTokenizer(bert_pipeline(models.WordPiece(vocab, unk_token=UNK)), f"{size} test pieces")


@pytest.mark.slow
def test_a_bert_run_exports_as_bert_for_pretraining_with_its_vocabulary_and_reads_back_exactly(loaded, tmp_path):
    """A scanned BertForPretraining (every parameter moved by noise, the heads too) and its 140-piece
    WordPiece tokenizer, saved as a run folder (config.json, a checkpoint, tokenizer/) and exported by
    `lm export`: the tensors and shapes transformers' BertForPreTraining saves (the decoder tied, not
    written), its config.json fields, a vocab.txt that reads back as the same vocabulary, and
    init_from=hf: of the folder gives every parameter back exactly."""
    from lm.cli.export import export_run
    from lm.train.checkpoint import Checkpointer

    config, _, params, _ = loaded("bert_model", True)
    keys = iter(jax.random.split(jax.random.key(0), len(jax.tree.leaves(params))))
    params = jax.tree.map(lambda p: p + jax.random.normal(next(keys), p.shape), params)
    tokenizer = wordpiece_of_size(140)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(config.to_json_best_effort())
    tokenizer.save(run / "tokenizer")
    checkpointer = Checkpointer(str(run / "checkpoints"), 1)
    checkpointer.save(3, {"params": params})
    checkpointer.close()
    out = tmp_path / "exported"
    export_run(run, out, "float32")

    theirs = {name: value.shape for name, value in Folder(FIXTURES / "bert", "").abstract().items()}
    theirs.update({"bert.pooler.dense.weight": (32, 32), "bert.pooler.dense.bias": (32,),
                   "cls.seq_relationship.weight": (2, 32), "cls.seq_relationship.bias": (2,)})
    assert {name: value.shape for name, value in Folder(out, "").abstract().items()} == theirs
    written = json.loads((out / "config.json").read_text())
    fixture = json.loads((FIXTURES / "bert" / "config.json").read_text())
    for field in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                  "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "hidden_act"):
        assert written[field] == fixture[field], field
    assert written["architectures"] == ["BertForPreTraining"]
    assert WordPieceTokenizer.from_vocab(str(out / "vocab.txt")).tokenizer.get_vocab() == \
        tokenizer.tokenizer.get_vocab()
    assert json.loads((out / "tokenizer_config.json").read_text())["do_lower_case"] is True

    source = HFSource(str(out), config)
    reloaded = source.load_params(jax.tree.map(lambda _: jax.devices()[0], source.abstract_params()))
    reloaded = flat_params(init_from.in_layout_of(reloaded, params))
    assert reloaded.keys() == flat_params(params).keys()
    for key, value in flat_params(params).items():
        np.testing.assert_array_equal(without_padding(key, reloaded[key], 140), without_padding(key, value, 140),
                                      err_msg=key)


def test_a_bert_run_bert_cannot_hold_is_one_line(loaded, tmp_path):
    config = loaded("bert")[0].copy_and_resolve_references()
    config.model.update(norm_position="pre", position="rope")
    with pytest.raises(UserError, match=r"^no Hugging Face architecture holds this run's model: BertForPreTraining "
                                        r"needs model.norm_position=post \(this run: pre\), model.position=learned "
                                        r"\(this run: rope\)$"):
        export(config, {}, 140, tmp_path / "out", tokenizer=wordpiece_of_size(140))


def test_a_bare_gpt2model_checkpoint_with_mask_buffers_reads_as_well(loaded, tmp_path):
    """The hub's gpt2 folder: names without 'transformer.' and the attention's causal-mask buffers."""
    folder = tmp_path / "gpt2_hub"
    shutil.copytree(FIXTURES / "gpt2", folder)
    tensors = load_file(folder / "model.safetensors")
    bare = {name.removeprefix("transformer."): value for name, value in tensors.items()}
    bare.update({f"h.{i}.attn.bias": np.tril(np.ones((1, 1, 32, 32), np.float32)) for i in range(2)})
    save_file(bare, folder / "model.safetensors")
    config, _, expected, _ = loaded("gpt2")
    source = HFSource(str(folder), config)
    params = source.load_params(jax.tree.map(lambda _: jax.devices()[0], source.abstract_params()))
    jax.tree.map(np.testing.assert_array_equal, params, expected)


def edited_folder(tmp_path: pathlib.Path, name: str, **changes) -> pathlib.Path:
    """A copy of a fixture with config.json fields changed."""
    folder = tmp_path / name
    shutil.copytree(FIXTURES / name, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_what_lm_cannot_represent_is_one_clear_line(tmp_path):
    config = following(str(FIXTURES / "llama"), base_config("language_model"))
    cases = [
        (edited_folder(tmp_path, "gpt2", architectures=["T5ForConditionalGeneration"]),
         r"config.json's architectures are \['T5ForConditionalGeneration'\]; lm reads GPT2LMHeadModel, "),
        (edited_folder(tmp_path, "llama", rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1.0}),
         r"config.json has rope_type='dynamic', which lm cannot represent: transformers' dynamic NTK grows the base"),
        (edited_folder(tmp_path, "vit", qkv_bias=False),
         r"config.json has qkv_bias=False, which lm cannot represent"),
        (FIXTURES / "vit", r"is a ViTForImageClassification, for an experiment=image_classification run; "
                           r"this run's experiment is language_model"),
    ]
    for folder, message in cases:
        with pytest.raises(UserError, match=message) as raised:
            HFSource(str(folder), config)
        assert "\n" not in str(raised.value)
    config.model.update(num_kv_heads=4, norm="layer")
    with pytest.raises(UserError, match=(
            r"this run's config differs from config.json: model.num_kv_heads=4 \(config.json num_key_value_heads=2\), "
            r"model.norm=layer \(LlamaForCausalLM: rms\); run with --config.model.num_kv_heads=2 "
            r"--config.model.norm=rms, or with --config.init_from_config=True to take them from config.json$")):
        HFSource(str(FIXTURES / "llama"), config)
    config.model.update(num_kv_heads=2, norm="rms", position="alibi")
    with pytest.raises(UserError, match=r"no Hugging Face architecture holds this run's model: GPT2LMHeadModel needs "
                                        r"model.num_kv_heads=4 \(this run: 2\), .*; LlamaForCausalLM needs "
                                        r"model.position=rope \(this run: alibi\)$"):
        export(config, {}, 150, tmp_path / "out")


def test_a_context_longer_than_the_position_table_is_reported_with_the_other_differences():
    """GPT-2's n_positions bounds data.context_length: one line with every difference and every flag."""
    config = following(str(FIXTURES / "gpt2"), base_config("language_model"))
    config.model.embed_dim, config.data.context_length = 64, 48
    with pytest.raises(UserError, match=(
            r"this run's config differs from config.json: model.embed_dim=64 \(config.json n_embd=32\), "
            r"data.context_length=48 \(at most config.json n_positions=32\); run with --config.model.embed_dim=32 "
            r"--config.data.context_length=32, or with --config.init_from_config=True to take them from config.json$"
    )) as raised:
        HFSource(str(FIXTURES / "gpt2"), config)
    assert "\n" not in str(raised.value)
    assert following(str(FIXTURES / "gpt2"), config).data.context_length == 32  # a config the folder accepts
    config.model.embed_dim, config.data.context_length = 32, 32
    HFSource(str(FIXTURES / "gpt2"), config)  # all of the position table


@pytest.mark.slow
def test_a_run_starts_from_a_hf_folder_and_the_export_cli_writes_it_back(tmp_path, capsys):
    """init_from=hf:DIR through the trainer (2 steps at learning rate 0), then
    `lm export` of the run: the fixture's tensors, exactly."""
    from lm.cli.export import export_run
    from lm.train.loop import train

    config = following(str(FIXTURES / "gpt2"), base_config("language_model"))
    config.init_from = f"hf:{FIXTURES / 'gpt2'}"
    config.data.context_length = 32  # all of the position table: the export gives back every row
    config.model.update(scan_layers=False, loss_chunk=0)  # (quicker to compile)
    config.optimizer.update(learning_rate=0.0, min_learning_rate=0.0)
    config.train.update(num_steps=2, log_every=1, checkpoint_every=2)
    config.eval.update(every=2, num_batches=1)
    train(config, str(tmp_path / "run"), build_experiment, devices=jax.devices()[:1])
    out = capsys.readouterr().out
    assert f"init_from=hf:{FIXTURES / 'gpt2'}: a GPT2LMHeadModel; this run's config agrees" in out
    assert "loaded        36 arrays" in out and "initialised    0 arrays" in out and "dropped        0 arrays" in out
    export_run(tmp_path / "run", tmp_path / "exported", "float32")
    exported, original = load_file(tmp_path / "exported" / "model.safetensors"), load_file(
        FIXTURES / "gpt2" / "model.safetensors")
    assert exported.keys() == original.keys()
    for name, value in original.items():
        np.testing.assert_array_equal(exported[name], value, err_msg=name)
    written = json.loads((tmp_path / "exported" / "config.json").read_text())
    fixture = json.loads((FIXTURES / "gpt2" / "config.json").read_text())
    for field in ("n_layer", "n_head", "n_embd", "n_inner", "vocab_size", "activation_function"):
        assert written[field] == fixture[field], field
    assert written["n_positions"] == config.data.context_length


def test_an_export_is_readable_as_any_written_file_and_names_its_tokenizers_end_of_text(loaded, tmp_path):
    """The files get mode 0666 less the umask (0644 under 022), as a plain write gives them, and a byte-level BPE's
    <|endoftext|> is config.json's bos_token_id and eos_token_id (GPT-2's tokenizer: 50256 for both)."""
    from lm.data.bpe import BPETokenizer

    config, _, params, _ = loaded("gpt2")
    tokenizer = BPETokenizer.load(FIXTURES.parent / "eval" / "gpt2" / "tokenizer.json")
    umask = os.umask(0o022)
    try:
        _, files = export(config, params, config.data.vocab_size, tmp_path / "out", tokenizer=tokenizer)
    finally:
        os.umask(umask)
    assert {file: oct((tmp_path / "out" / file).stat().st_mode & 0o777) for file in files} == dict.fromkeys(
        files, "0o644")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["bos_token_id"] == written["eos_token_id"] == tokenizer.tokenizer.token_to_id("<|endoftext|>") == 0
    export(config, params, config.data.vocab_size, tmp_path / "bare")  # no tokenizer: no ids to name
    assert json.loads((tmp_path / "bare" / "config.json").read_text())["eos_token_id"] is None
