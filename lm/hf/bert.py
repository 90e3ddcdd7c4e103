"""BERT (transformers' BertForMaskedLM, BertModel) -> lm's BertForPretraining (lm/models/bert.py,
experiment masked_lm): post-norm LayerNorm blocks, erf GELU ("gelu"), learned positions
(model.max_positions = max_position_embeddings), segments (model.type_vocab_size = type_vocab_size).

Under "bert": the embeddings (token, position, segment tables and their LayerNorm), the encoder and,
from BertModel, the pooler. BertForMaskedLM's prediction head (cls.predictions: dense, GELU,
LayerNorm, the tied token table, a bias) is lm's mlm_head; it has no pooler and neither checkpoint has
the next-sentence head, so those keep their fresh initialisation. The vocabulary is the run's
tokenizer's (data.vocab), so only its padded shape is checked, with the tables.
"""

import ml_collections

from lm.hf.mapping import Fields, Rule, copy, dense, mlp_kind, norm, padded_vocab, unsupported, vocab_rows

ARCHITECTURES = ("BertForMaskedLM", "BertModel")
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
        "model.num_layers": (hf["num_hidden_layers"], "num_hidden_layers"),
        "model.num_heads": (hf["num_attention_heads"], "num_attention_heads"),
        "model.num_kv_heads": (hf["num_attention_heads"], "num_attention_heads"),
        "model.embed_dim": (hf["hidden_size"], "hidden_size"),
        "model.mlp": (mlp_kind(hf, "hidden_act", "gelu"), "hidden_act"),
        "model.mlp_hidden_dim": (hf["intermediate_size"], "intermediate_size"),
        "model.norm": ("layer", ""),
        "model.norm_position": ("post", ""),
        "model.norm_epsilon": (hf.get("layer_norm_eps", 1e-12), "layer_norm_eps"),
        "model.position": ("learned", ""),
        "model.use_bias": (True, ""),
        "model.moe.num_experts": (0, ""),
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
    if architecture == "BertModel":
        found += dense("bert.pooler.dense", "bert/pooler", (width,), (width,))
    else:
        found += dense("cls.predictions.transform.dense", "mlm_head/dense", (width,), (width,))
        found += norm("cls.predictions.transform.LayerNorm", "mlm_head/norm", "layer")
        found.append(copy("cls.predictions.bias", "mlm_head/bias"))
    return found
