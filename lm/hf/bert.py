"""BERT (transformers' BertForPreTraining, BertForMaskedLM, BertModel) <-> lm's BertForPretraining
(lm/models/bert.py, experiment masked_lm): post-norm LayerNorm blocks, erf GELU ("gelu"), learned
positions (model.max_positions = max_position_embeddings), segments (model.type_vocab_size =
type_vocab_size).

Under "bert": the embeddings (token, position, segment tables and their LayerNorm), the encoder and the
pooler (BertModel, BertForPreTraining). The masked-LM head (cls.predictions: dense, GELU, LayerNorm, the
tied token table, a bias) is lm's mlm_head (BertForMaskedLM, BertForPreTraining); the next-sentence head
(cls.seq_relationship, D -> 2) is nsp_head (BertForPreTraining). What a checkpoint lacks keeps its fresh
initialisation. On import the vocabulary is the run's tokenizer's (data.vocab), so only its padded shape
is checked, with the tables; a run exports as BertForPreTraining, its WordPiece vocabulary as vocab.txt
and tokenizer_config.json beside the weights (save_tokenizer), which transformers' BertTokenizer reads.
"""

import json
import pathlib

import ml_collections

from lm.data.wordpiece import WordPieceTokenizer
from lm.hf.mapping import (
    Fields,
    Rule,
    copy,
    dense,
    encoder_config,
    encoder_fields,
    norm,
    padded_vocab,
    unsupported,
    vocab_rows,
)

ARCHITECTURES = ("BertForPreTraining", "BertForMaskedLM", "BertModel")
EXPERIMENT = "masked_lm"
PREFIX = "bert."  # a BertModel checkpoint has its names without it
IGNORED = ("cls.predictions.decoder.", "position_ids")  # the tied output layer (and its bias, = .bias); a buffer


def lm_fields(hf: dict) -> Fields:
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise unsupported("position_embedding_type", hf["position_embedding_type"],
                          "lm's BERT adds a learned absolute position table")
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise unsupported("is_decoder", True, "lm's BERT is a bidirectional encoder")
    return {
        **encoder_fields(hf, "post"),
        "model.use_bias": (True, ""),
        "model.max_positions": (hf["max_position_embeddings"], "max_position_embeddings"),
        "model.type_vocab_size": (hf.get("type_vocab_size", 2), "type_vocab_size"),
    }


def rules(hf: dict, architecture: str, config: ml_collections.ConfigDict) -> list[Rule]:
    vocab, width, heads = hf["vocab_size"], hf["hidden_size"], hf["num_attention_heads"]
    hidden, head_dim = hf["intermediate_size"], width // heads
    found = [vocab_rows("bert.embeddings.word_embeddings.weight", "bert/embeddings/token_embed/embedding", vocab,
                        padded_vocab(vocab, config.model.vocab_multiple)),
             copy("bert.embeddings.position_embeddings.weight", "bert/embeddings/position_embed/embedding"),
             copy("bert.embeddings.token_type_embeddings.weight", "bert/embeddings/segment_embed/embedding")]
    found += norm("bert.embeddings.LayerNorm", "bert/embeddings/norm", "layer")
    for i in range(hf["num_hidden_layers"]):
        hf_block, block = f"bert.encoder.layer.{i}", f"bert/encoder/block_{i}"
        for name in ("query", "key", "value"):
            found += dense(f"{hf_block}.attention.self.{name}", f"{block}/attention/{name}", (width,),
                           (heads, head_dim))
        found += dense(f"{hf_block}.attention.output.dense", f"{block}/attention/out", (heads, head_dim), (width,))
        found += norm(f"{hf_block}.attention.output.LayerNorm", f"{block}/norm_attention", "layer")
        found += dense(f"{hf_block}.intermediate.dense", f"{block}/mlp/up", (width,), (hidden,))
        found += dense(f"{hf_block}.output.dense", f"{block}/mlp/down", (hidden,), (width,))
        found += norm(f"{hf_block}.output.LayerNorm", f"{block}/norm_mlp", "layer")
    if architecture != "BertForMaskedLM":
        found += dense("bert.pooler.dense", "bert/pooler", (width,), (width,))
    if architecture != "BertModel":
        found += dense("cls.predictions.transform.dense", "mlm_head/dense", (width,), (width,))
        found += norm("cls.predictions.transform.LayerNorm", "mlm_head/norm", "layer")
        found.append(copy("cls.predictions.bias", "mlm_head/bias"))
    if architecture == "BertForPreTraining":
        found += dense("cls.seq_relationship", "nsp_head", (width,), (2,))
    return found


def hf_config(config: ml_collections.ConfigDict, vocab_size: int) -> dict:
    """config.json of a masked_lm run with a vocabulary of vocab_size (its tokenizer's)."""
    m = config.model
    return {
        "architectures": [ARCHITECTURES[0]], "model_type": "bert", "vocab_size": vocab_size,
        **encoder_config(config),
        "max_position_embeddings": m.max_positions, "type_vocab_size": m.type_vocab_size,
        "position_embedding_type": "absolute", "tie_word_embeddings": True,
    }


def save_tokenizer(tokenizer: WordPieceTokenizer, config: ml_collections.ConfigDict,
                   out: pathlib.Path) -> list[str]:
    """The run's WordPiece vocabulary as transformers' BertTokenizer reads it: vocab.txt (one piece a
    line, in id order, as the tokenizers library saves a WordPiece model) and tokenizer_config.json
    (lowercasing and accent stripping as the run's normalizer does them). Returns the files written."""
    tokenizer.tokenizer.model.save(str(out))  # vocab.txt
    normalizer = tokenizer.tokenizer.normalizer
    settings = {"tokenizer_class": "BertTokenizer", "do_lower_case": normalizer.lowercase,
                "strip_accents": normalizer.strip_accents, "tokenize_chinese_chars": normalizer.handle_chinese_chars,
                "model_max_length": config.model.max_positions}
    (out / "tokenizer_config.json").write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")
    return ["vocab.txt", "tokenizer_config.json"]
