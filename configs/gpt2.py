r"""GPT-2 pretraining on a pre-tokenised corpus (GPT-2 BPE ids in nanoGPT's train.bin / val.bin format).

Variants (pick one after the colon); all are GPT-2 shaped: pre-norm LayerNorm, GELU MLP 4x wide,
learned positions, tied embeddings, context 1024, the 50,257-id vocabulary padded to 50,304 (a
multiple of 128, so the embedding and the logits split evenly and map onto whole matmul tiles).

  124m  12 layers, 12 heads, 768 wide: 124M parameters.
        lm train --config=configs/gpt2.py:124m --workdir=runs/gpt2_124m
        The llm.c / nanoGPT reproduction: batch 512 x 1024 tokens (0.5M; 8 micro-batches of 64),
        AdamW 6e-4 (b2 0.95, weight decay 0.1), 700 warmup steps, cosine to 6e-5 at 19,073 steps
        (10B tokens). Reference points: val loss about 3.3 on OpenWebText/FineWeb at 10B tokens
        (llm.c). Not yet run here (no accelerator so far). On FineWeb-Edu's 10B-token sample: lm prepare
        --source=files:.../*.parquet into token shards, then --config.data.source=tokens:DIR (docs/data.md).
        Its 12 layers are unrolled: on an H100 (jax 0.11.2, batch 16 x 1024) the scanned stack took
        54.1 ms a step and 17.3 GiB, the unrolled one 38.3 ms and 11.9 GiB (--config.model.scan_layers=true
        halves the compile).
  350m  24 layers, 16 heads, 1024 wide: 350M parameters; lr 3e-4, scanned layers, remat of everything
        but the weight matmuls (dots_no_batch) and a chunked loss to fit larger micro-batches.
  774m  36 layers, 20 heads, 1280 wide: 774M parameters; lr 2.5e-4, the same memory savings.
  bpe_small  4 layers, 4 heads, 128 wide, context 128, batch 16, 600 steps, float32: a CPU model for token
        files that `lm prepare` wrote with their tokenizer (docs/text-gpt.md).
        lm prepare --text=$LM_DATA_DIR/tinyshakespeare/input.txt --tokenizer=bpe \
            --vocab_size=2048 --out=/tmp/shakespeare_bpe
        lm train --config=configs/gpt2.py:bpe_small --workdir=runs/shakespeare_bpe \
            --config.data.train_file=/tmp/shakespeare_bpe/train.bin \
            --config.data.val_file=/tmp/shakespeare_bpe/val.bin \
            --config.data.tokenizer=/tmp/shakespeare_bpe/tokenizer.json
        Tiny Shakespeare, BPE 2048: val loss 4.61 per token (1.68 per character) in 4 min 55 s on a
        shared 2-core CPU (1.07M parameters, 3,700-5,600 tokens/s).
        The same model on documents of jsonl files, rows packed by document (docs/data.md makes
        /tmp/corpus_jsonl of the shared BERT corpus and /tmp/corpus_bpe, a BPE of 4,096 ids):
        lm train --config=configs/gpt2.py:bpe_small --workdir=runs/corpus_documents \
            --config.data.source='files:/tmp/corpus_jsonl/*.jsonl' \
            --config.data.tokenizer=/tmp/corpus_bpe/tokenizer.json
        val loss 5.35 per token in 4 min 22 s on a shared 2-core CPU (concatenated: 5.34; docs/data.md)
  test  2 layers (scanned), 4 heads, 64 wide, context 64, a tiny vocabulary, synthetic ids: for tests and a
        CPU smoke run.
        lm train --config=configs/gpt2.py:test --workdir=/tmp/gpt2_test

Data: data.train_file / data.val_file are raw little-endian uint16 token ids (uint32 for
vocabularies past 65,536: data.token_dtype), absolute or relative to $LM_DATA_DIR; nanoGPT's
data/openwebtext/prepare.py writes them, and `lm prepare` (any text files, a trained
BPE or GPT-2's tokenizer) with the tokenizer.json that data.tokenizer names. Or documents, tokenised as the run
starts: --config.data.source=files:GLOB (or tfds:..., hf:...; docs/data.md), which selects data.dataset=source,
with GPT-2's tokenizer unless data.tokenizer names another. The vocabulary (data.vocab_size 0) is the
tokenizer's; token ids without a tokenizer are GPT-2's 50,257.
For throughput runs without data:
  --config.data.dataset=synthetic  (uniformly random ids; the loss stays at ln(50257) = 10.8).

Throughput (benchmarks/step_time.py prints tokens/s, step time, compile time, memory and MFU):
  python benchmarks/step_time.py --config=configs/gpt2.py:124m --config.data.dataset=synthetic \
      --arms=model.remat=none,dots_no_batch,full
Performance switches (same numerics, see lm/layers/transformer.py and lm/models/gpt.py):
  model.compute_dtype=bfloat16 (params and optimizer state stay float32), model.attention_impl=auto
  (cuDNN flash attention on GPU), model.scan_layers, model.remat, model.loss_chunk,
  train.prefetch, train.steps_per_dispatch, train.compilation_cache_dir (on by default).
"""

import ml_collections

from configs import base

SIZES = {  # variant: (layers, heads, width)
    "124m": (12, 12, 768),
    "350m": (24, 16, 1024),
    "774m": (36, 20, 1280),
}


def get_config(variant: str = "124m") -> ml_collections.ConfigDict:
    config = base.language_model("token_file")
    # GPT-2's recipe; every variant below sets the size.
    config.model.update(compute_dtype="bfloat16", vocab_multiple=128)
    config.optimizer.update(learning_rate=6e-4, min_learning_rate=6e-5, warmup_steps=700, b2=0.95)
    config.train.update(batch_size=512, grad_accum_steps=8, num_steps=19073, log_every=20, checkpoint_every=1000)
    config.eval.update(every=500, batch_size=64, num_batches=20)  # 1.3M val tokens
    config.sample.max_new_tokens = 0  # token ids: no text sample after training

    if variant in SIZES:
        layers, heads, width = SIZES[variant]
        config.model.update(num_layers=layers, num_heads=heads, num_kv_heads=heads, embed_dim=width)
        if variant != "124m":  # scanned: compile time grows little with depth
            config.model.update(remat="dots_no_batch", scan_layers=True)
            config.optimizer.learning_rate = {"350m": 3e-4, "774m": 2.5e-4}[variant]
            config.optimizer.min_learning_rate = config.optimizer.learning_rate / 10
    elif variant == "bpe_small":
        config.data.context_length = 128  # (the vocabulary: data.tokenizer's)
        config.model.update(num_layers=4, num_heads=4, num_kv_heads=4, embed_dim=128, compute_dtype="float32")
        config.train.update(batch_size=16, grad_accum_steps=1, num_steps=600, log_every=50, checkpoint_every=300)
        config.optimizer.update(learning_rate=1e-3, min_learning_rate=1e-4, warmup_steps=50, b2=0.99)
        config.eval.update(every=200, batch_size=32, num_batches=8)
        config.sample.update(max_new_tokens=100)
    elif variant == "test":
        config.data.update(dataset="synthetic", vocab_size=500, context_length=64)
        config.model.update(num_layers=2, num_heads=4, num_kv_heads=4, embed_dim=64, loss_chunk=16, scan_layers=True)
        config.train.update(batch_size=8, grad_accum_steps=1, num_steps=20, log_every=5, checkpoint_every=10)
        config.optimizer.warmup_steps = 2
        config.eval.update(every=10, batch_size=8, num_batches=2)
    else:
        raise ValueError(f"unknown variant {variant!r} of configs/gpt2.py: use 124m, 350m, 774m, bpe_small or test")
    return config
