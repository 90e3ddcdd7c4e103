"""Direct preference optimisation of a GPT on chosen/rejected pairs (experiments/dpo.py), against a frozen
reference: the run's starting parameters (init_from), whose log-probabilities of every pair are computed once when
the run starts (no second copy of the weights, with or without LoRA).

The pairs come from any source of the data layer: hh-rlhf's format by default (data.chosen_field and
data.rejected_field whole transcripts sharing the prompt up to the last "\\n\\nAssistant:"), or with
data.prompt_field records of a prompt and two responses. dpo.beta scales the implicit reward beta * (log pi -
log ref). Logged: dpo_loss, reward_accuracy, reward_margin, chosen_reward, rejected_reward (train, eval_* held out,
val_* over every held-out pair after training). A pair longer than a row keeps both responses whole and its
prompt's end; one whose response leaves no room for its prompt is dropped (both counted). LoRA:
--config.model.lora.rank=8 (docs/post-training.md).

Variants (pick one after the colon):

  hh     GPT-2 124M's shape and tokenizer on hh-rlhf helpful-base (its test split, the only one shipped: 2,354
         pairs, the last 10% held out; skipped: its 2 pairs with identical responses and 2 whose transcripts
         differ before the last turn), context 512, batch 32, beta 0.1 and AdamW 1e-6 (TRL's defaults), 300
         steps: from a GPT-2 folder (or its SFT run).
         lm train --config=configs/dpo.py:hh --workdir=runs/dpo_hh --config.init_from=hf:/path/to/gpt2
  small  configs/sft.py:small's model (4 layers, 128 wide) on helpful-base, batch 8 pairs, 250 steps, AdamW 1e-4,
         with the tokenizer and context of init_from's run: the CPU measurement of docs/post-training.md, from the
         small GPT pretrained there (the 4,096-id corpus BPE, context 256).
         lm train --config=configs/dpo.py:small --workdir=runs/dpo_small --config.init_from=runs/corpus_gpt_256
  test   2 layers, 32 wide, context 64, the first 48 helpful-base pairs with GPT-2's tokenizer, 4 steps: seconds
         on a CPU, from a fresh model.
         lm train --config=configs/dpo.py:test --workdir=/tmp/dpo_test
"""

import ml_collections

from configs import base, sft
from lm.layers.options import above, at_least, declare, option

VARIANTS = ("hh", "small", "test")


def preference_data() -> ml_collections.ConfigDict:
    """The pairs and the rows they are laid into."""
    return declare(
        ml_collections.ConfigDict(),
        **sft.record_sources("files:hh-rlhf/helpful-base/test.jsonl.gz", "", 0.1, "pairs"),
        chosen_field=option("chosen", "the field holding the preferred response (a whole transcript without "
                                      "prompt_field)"),
        rejected_field=option("rejected", "the field holding the other response (a whole transcript without "
                                          "prompt_field)"),
        prompt_field=option("", "the field holding the prompt ('' = the transcripts' common start up to the last "
                                "response_marker)"),
        response_marker=option("\n\nAssistant:", "without prompt_field, where the response starts: after the chosen "
                                                 "transcript's last one (hh-rlhf's)"),
        skip_bad_records=option(False, "skip (and count) the records that give no pair (a missing field, no "
                                       "response_marker, identical responses) instead of stopping at the first"),
        **sft.tokenizer_options(),
        context_length=option(512, "tokens per row: a pair is two rows, prompt + chosen and prompt + rejected; left "
                                   "at 512 with init_from=RUN: the run's", bounds=at_least(1)),
    )


def get_config(variant: str = "hh") -> ml_collections.ConfigDict:
    config = base.language_model("token_file")  # the model, optimizer, train, sample and mesh sections
    config.experiment = "dpo"
    config.data = preference_data()
    config.dpo = declare(ml_collections.ConfigDict(), beta=option(
        0.1, "the implicit reward's scale, beta * (log pi - log ref): how far the policy may move from the reference",
        bounds=above(0)))
    config.eval = sft.eval_options()
    config.model.update(compute_dtype="float32", vocab_multiple=128)
    config.optimizer.update(learning_rate=1e-6, min_learning_rate=1e-7, warmup_fraction=0.1, weight_decay=0.0)
    config.train.update(batch_size=32, num_steps=300, log_every=10, checkpoint_every=100)
    config.sample.update(prompt="\n\nHuman: How do I make a cup of tea?\n\nAssistant:", max_new_tokens=64)

    if variant == "hh":
        config.model.update(num_layers=12, num_heads=12, num_kv_heads=12, embed_dim=768)
        config.data.skip_bad_records = True  # helpful-base's 4 bad pairs (module docstring)
    elif variant == "small":
        config.model.update(num_layers=4, num_heads=4, num_kv_heads=4, embed_dim=128)
        config.data.skip_bad_records = True
        config.optimizer.update(learning_rate=1e-4, min_learning_rate=1e-5)
        config.train.update(batch_size=8, num_steps=250, log_every=25, checkpoint_every=250)
        config.eval.update(every=50, batch_size=32, num_batches=8)  # every held-out pair (235 after the skips)
    elif variant == "test":
        config.model.update(num_layers=2, num_heads=2, num_kv_heads=2, embed_dim=32)
        config.data.update(max_records=48, context_length=64)
        config.optimizer.update(learning_rate=1e-3, min_learning_rate=1e-4, warmup_steps=1)
        config.train.update(batch_size=4, num_steps=4, log_every=2, checkpoint_every=4)
        config.eval.update(every=2, batch_size=4, num_batches=2)
        config.sample.max_new_tokens = 0
    else:
        raise ValueError(f"unknown variant {variant!r} of configs/dpo.py: use {', '.join(VARIANTS)}")
    return config
