"""Supervised fine-tuning of a GPT on conversations (experiments/sft.py): the loss on the assistant's tokens only.

The records come from any source of the data layer (files:GLOB of .jsonl/.parquet, tfds:..., hf:...;
docs/data.md): prompt/response pairs (data.prompt_field, data.response_field: GSM8K's question and answer by
default) or conversations (data.messages_field: a list of {role, content} messages). A chat template renders
them (data.chat_template: plain, chatml, or a Hugging Face folder's; lm/data/chat.py); the conversations are
packed by conversation into rows with segment ids. data.train_on_prompt=True is the ablation with the loss on
every token. A conversation longer than a row (data.context_length + 1 tokens) is cut from the left, keeping its
last assistant response whole; one whose last response does not fit is dropped; both are counted and printed.
The weights start from init_from (a run of the same model, or hf:DIR); LoRA: --config.model.lora.rank=8
(docs/post-training.md).

Variants (pick one after the colon):

  gsm8k  GPT-2 124M's shape and tokenizer on GSM8K (train 7,473 pairs; held out: the test split's 1,319), the
         plain template, context 512, batch 32, 1,000 steps, AdamW 2e-5: the weights from a GPT-2 folder.
         lm train --config=configs/sft.py:gsm8k --workdir=runs/sft_gsm8k --config.init_from=hf:/path/to/gpt2
  small  configs/gpt2.py:bpe_small's shape (4 layers, 4 heads, 128 wide) on GSM8K, batch 16, 300 steps, with the
         tokenizer and context of init_from's run: the CPU measurement of docs/post-training.md, from the small
         GPT pretrained there (its commands make runs/corpus_gpt_256: a 4,096-id BPE of the shared corpus,
         context 256).
         lm train --config=configs/sft.py:small --workdir=runs/sft_small --config.init_from=runs/corpus_gpt_256
  reverse  4 layers, 4 heads, 128 wide, byte tokens, context 64, on 300 digit strings to reverse (synthetic:reverse;
         held out: its val split), batch 32, 70 steps, AdamW 1e-3: the starting point of the GRPO study of
         docs/post-training.md (configs/grpo.py:reverse), a model that reverses about a third of the strings.
         lm train --config=configs/sft.py:reverse --workdir=runs/sft_reverse
  test   2 layers, 32 wide, context 128, the first 64 GSM8K test pairs with GPT-2's tokenizer, 6 steps: seconds on
         a CPU, from a fresh model (for tests and a smoke run).
         lm train --config=configs/sft.py:test --workdir=/tmp/sft_test
"""

import ml_collections

from configs import base
from lm.layers.options import Range, at_least, declare, option
from lm.train.options import eval_every_option

VARIANTS = ("gsm8k", "small", "reverse", "test")


def record_sources(source: str, val_source: str, val_fraction: float, records: str) -> dict:
    """The data options of where a post-training run's records come from (SFT's and DPO's): the training and
    held-out sources and how many records to read; records names what a record is ("records", "pairs")."""
    return dict(
        source=option(source, f"the training {records}: files:GLOB (.jsonl, .jsonl.gz, .parquet), "
                              "tfds:NAME[/CONFIG][:SPLIT] or hf:NAME_OR_DIR[:CONFIG][:SPLIT]"),
        val_source=option(val_source, f"the held-out {records}, as source ('' = the last val_fraction of source's)"),
        val_fraction=option(val_fraction, f"without val_source, the share of source's {records} (the last ones) "
                                          "held out", bounds=Range(0, 1, low_open=True, high_open=True)),
        max_records=option(0, "the first so many records of each source (0: all)", bounds=at_least(0)),
    )


def tokenizer_options() -> dict:
    """The data options of the tokenizer a post-training run's text is encoded with."""
    return dict(
        tokenizer=option("gpt2", "gpt2 (GPT-2's own, $LM_DATA_DIR/vocab), bytes (an id a UTF-8 byte, 257 ids with "
                                 "<|endoftext|>) or the path of a tokenizer.json, absolute or relative to $LM_DATA_DIR "
                                 "(left at gpt2 with init_from=RUN: the run's)"),
        vocab_size=option(0, "ids in the vocabulary; 0: the tokenizer's", bounds=at_least(1, 0)),
    )


def chat_template_option():
    """data.chat_template: what renders a post-training run's records as conversations."""
    return option("plain", "plain, chatml, or the path of a Hugging Face folder (its chat template), a "
                           "tokenizer_config.json or a .jinja file (lm/data/chat.py)")


def conversation_data() -> ml_collections.ConfigDict:
    """The records, their chat template and the rows they are packed into."""
    return declare(
        ml_collections.ConfigDict(),
        **record_sources("files:gsm8k/train.jsonl.gz", "files:gsm8k/test.jsonl", 0.05, "records"),
        prompt_field=option("question", "the field of a prompt/response record holding the user's prompt"),
        response_field=option("answer", "the field of a prompt/response record holding the assistant's response"),
        messages_field=option("", "instead of the prompt and response fields, the field holding a conversation: a "
                                  "list of {role, content} messages"),
        chat_template=chat_template_option(),
        train_on_prompt=option(False, "the loss on every token, prompts included (the ablation); False: on the "
                                      "assistant's tokens only (held-out loss is always the assistant's)"),
        skip_bad_records=option(False, "skip (and count) the records that give no conversation (a missing field, "
                                       "a template that fails on them) instead of stopping at the first"),
        **tokenizer_options(),
        context_length=option(512, "tokens per training row (conversations are packed into rows); left at 512 with "
                                   "init_from=RUN: the run's", bounds=at_least(1)),
    )


def eval_options(**overrides) -> ml_collections.ConfigDict:
    section = declare(
        ml_collections.ConfigDict(),
        every=eval_every_option("held-out evaluations"),
        batch_size=option(32, "rows (or pairs) per eval batch", bounds=at_least(1)),
        num_batches=option(8, "eval batches per periodic evaluation (the same ones every time; the final results "
                              "score every held-out row)", bounds=at_least(1)),
    )
    section.update(overrides)
    return section


def get_config(variant: str = "gsm8k") -> ml_collections.ConfigDict:
    config = base.language_model("token_file")  # the model, optimizer, train, sample and mesh sections
    config.experiment = "sft"
    config.data = conversation_data()
    config.eval = eval_options()
    config.model.update(compute_dtype="float32", vocab_multiple=128)
    config.optimizer.update(learning_rate=2e-5, min_learning_rate=2e-6, warmup_fraction=0.03, weight_decay=0.0,
                            b2=0.999)
    config.train.update(batch_size=32, num_steps=1000, log_every=20, checkpoint_every=500)
    config.sample.update(prompt="Natalia sold clips to 48 of her friends in April, and then she sold half as many "
                                "clips in May. How many clips did Natalia sell altogether in April and May?",
                         max_new_tokens=128, temperature=0.0)  # the prompt: a user message, rendered by the template

    if variant == "gsm8k":
        config.model.update(num_layers=12, num_heads=12, num_kv_heads=12, embed_dim=768)
    elif variant == "small":
        config.model.update(num_layers=4, num_heads=4, num_kv_heads=4, embed_dim=128)
        config.optimizer.update(learning_rate=3e-4, min_learning_rate=3e-5)
        config.train.update(batch_size=16, num_steps=300, log_every=25, checkpoint_every=300)
        config.eval.update(every=100, batch_size=32, num_batches=8)
        config.sample.max_new_tokens = 96
    elif variant == "reverse":
        config.model.update(num_layers=4, num_heads=4, num_kv_heads=4, embed_dim=128)
        config.data.update(source="synthetic:reverse", val_source="synthetic:reverse:val", max_records=300,
                           prompt_field="prompt", response_field="response", tokenizer="bytes", context_length=64)
        config.optimizer.update(learning_rate=1e-3, min_learning_rate=1e-4, warmup_steps=20, weight_decay=0.1)
        config.train.update(batch_size=32, num_steps=70, log_every=10, checkpoint_every=70)
        config.eval.update(every=35, batch_size=64, num_batches=4)
        config.sample.update(prompt="12345", max_new_tokens=8)
    elif variant == "test":
        config.model.update(num_layers=2, num_heads=2, num_kv_heads=2, embed_dim=32)
        config.data.update(source="files:gsm8k/test.jsonl", val_source="", val_fraction=0.25, max_records=64,
                           context_length=128)
        config.optimizer.update(learning_rate=1e-3, min_learning_rate=1e-4, warmup_steps=1)
        config.train.update(batch_size=4, num_steps=6, log_every=3, checkpoint_every=6)
        config.eval.update(every=3, batch_size=4, num_batches=2)
        config.sample.max_new_tokens = 0
    else:
        raise ValueError(f"unknown variant {variant!r} of configs/sft.py: use {', '.join(VARIANTS)}")
    return config

