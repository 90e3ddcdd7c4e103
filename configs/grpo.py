"""Online reinforcement learning with verifiable rewards of a GPT (experiments/grpo.py): GRPO, Dr. GRPO and DAPO.

Each step samples rl.group_size completions of every prompt of the batch with the KV cache, scores them with the
reward functions of rl.rewards (built-ins or any importable `module:function`), normalises the rewards within each
prompt's group into advantages and takes rl.inner_steps clipped policy-gradient updates on them (the first with
the sampling policy's own log-probabilities). The prompts come from any source of the data layer, rendered by the
chat template with the assistant's turn opened; the held-out prompts are decoded greedily and scored at every
evaluation (heldout_accuracy, heldout_reward, ...; completions/step_<N>.jsonl) and, after training, every one of
them (val_accuracy, ...; completions.jsonl). The weights start from init_from: an SFT run (its tokenizer and
context come with it), or hf:DIR. LoRA: --config.model.lora.rank=8 (docs/post-training.md).

Variants (pick one after the colon):

  reverse   the CPU study of docs/post-training.md: configs/sft.py:reverse's model (4 layers, 128 wide, byte
            tokens) from its SFT run, on reversing digit strings (synthetic:reverse: 5,000 prompts, 2,000 held out),
            8 prompts x 8 completions of up to 10 tokens at temperature 0.5 a step, 150 steps, AdamW 5e-5 (constant,
            no weight decay), the `answer` reward: held-out accuracy from about a third to most strings.
            lm train --config=configs/grpo.py:reverse --workdir=runs/grpo_reverse --config.init_from=runs/sft_reverse
  gsm8k     GPT-2 124M's shape on GSM8K from its SFT run (configs/sft.py:gsm8k): 16 prompts x 8 completions of up
            to 256 tokens, 200 steps, AdamW 1e-6, the `answer` reward (GSM8K's `#### N`).
            lm train --config=configs/grpo.py:gsm8k --workdir=runs/grpo_gsm8k --config.init_from=runs/sft_gsm8k
  test      2 layers, 32 wide, byte tokens, reversals, 4 prompts x 4 completions of 8 tokens, 4 steps: seconds on a
            CPU, from a fresh model (for tests and a smoke run).
            lm train --config=configs/grpo.py:test --workdir=/tmp/grpo_test
"""

import ml_collections

from configs import base, sft
from lm.layers.options import Range, at_least, declare, option
from lm.losses import RL_LOSSES
from lm.rewards import Settings
from lm.train.options import eval_every_option

VARIANTS = ("reverse", "gsm8k", "test")


def prompt_data() -> ml_collections.ConfigDict:
    """The prompts, their records and the rows their completions are laid into."""
    return declare(
        ml_collections.ConfigDict(),
        **sft.record_sources("synthetic:reverse", "synthetic:reverse:val", 0.05, "prompts"),
        prompt_field=option("prompt", "the field holding the user's prompt"),
        answer_field=option("answer", "the field holding what the `answer` reward checks ('' = none); every field "
                                      "named here reaches the reward functions' record"),
        chat_template=sft.chat_template_option(),
        skip_bad_records=option(False, "skip (and count) the records that give no prompt (a missing field, a "
                                       "template that fails, a prompt too long for the context) instead of "
                                       "stopping at the first"),
        **sft.tokenizer_options(),
        context_length=option(512, "tokens of the model's context: the longest prompt plus rl.max_new_tokens must "
                                   "fit; left at 512 with init_from=RUN: the run's", bounds=at_least(1)),
    )


def rl_options() -> ml_collections.ConfigDict:
    return declare(
        ml_collections.ConfigDict(),
        loss=option("grpo", "grpo: each completion's token mean, then the mean over completions, advantages "
                            "scaled by the group's std; dr_grpo: the token sum over completions x max_new_tokens, "
                            "no std scaling (Dr. GRPO); dapo: the mean over every completion token, std scaling "
                            "(DAPO; set clip_high=0.28 for its asymmetric clip)", choices=RL_LOSSES),
        group_size=option(8, "completions sampled per prompt (the group its advantages are normalised in)",
                          bounds=at_least(2)),
        inner_steps=option(1, "updates per batch of completions (GRPO's mu; the first with the sampling policy's "
                              "log-probabilities, the next against them, clipped); train.steps_per_dispatch must "
                              "equal it", bounds=at_least(1)),
        clip_low=option(0.2, "the ratio pi / pi_old is clipped below at 1 - clip_low",
                        bounds=Range(0, 1, low_open=False, high_open=True)),
        clip_high=option(0.2, "the ratio is clipped above at 1 + clip_high (DAPO's clip-higher: 0.28)",
                         bounds=at_least(0)),
        kl_beta=option(0.0, "the weight of the k3 estimate of KL(pi || the starting parameters) per token (0: off, "
                            "no reference kept)", bounds=at_least(0)),
        kl_importance_weighted=option(False, "the k3 term multiplied by the ratio pi / pi_old (TRL's "
                                             "use_bias_correction_kl); False: DeepSeekMath's k3 alone"),
        rewards=option("answer", "the reward functions, NAME_OR_MODULE:FUNCTION[=WEIGHT],...: the built-ins "
                                 "answer, format, length, or any importable module:function (prompt, completion, "
                                 "record) -> float (lm/rewards.py)"),
        format_pattern=option(Settings.format_pattern, "the `format` reward: 1 where this regular expression "
                                                       "matches the whole completion (default: it ends on GSM8K's "
                                                       "'#### N' line)"),
        length_limit=option(0, "the `length` reward: -1 at and beyond this many characters (0: the rl.max_new_tokens "
                               "tokens' worth, 4 characters a token)", bounds=at_least(0)),
        length_buffer=option(0, "the `length` reward falls linearly from 0 to -1 over the last so many characters "
                                "before length_limit (0: a quarter of it)", bounds=at_least(0)),
        max_new_tokens=option(64, "the longest completion, in tokens", bounds=at_least(1)),
        temperature=option(1.0, "sampling temperature of the completions (and of the log-probabilities trained)",
                           bounds=Range(0, None, low_open=True)),
        top_k=option(0, "sample from the top_k most likely tokens (0: all)", bounds=at_least(0)),
        top_p=option(1.0, "nucleus sampling: from the most likely tokens whose probabilities add up to top_p",
                     bounds=Range(0, 1, low_open=True)),
        stop=option((), "stop strings: a completion ends after the first of them (besides the end-of-text id)"),
    )


def get_config(variant: str = "reverse") -> ml_collections.ConfigDict:
    config = base.language_model("token_file")  # the model, optimizer, train, sample and mesh sections
    config.experiment = "grpo"
    config.data = prompt_data()
    config.rl = rl_options()
    config.eval = declare(
        ml_collections.ConfigDict(),
        every=eval_every_option("held-out evaluations"),
        batch_size=option(64, "held-out prompts decoded at once", bounds=at_least(1)),
        num_prompts=option(256, "held-out prompts decoded greedily and scored at every evaluation (the first so "
                                "many; the final results score all)", bounds=at_least(1)),
    )
    config.model.update(compute_dtype="float32", vocab_multiple=128)
    config.optimizer.update(learning_rate=1e-6, min_learning_rate=1e-6, warmup_steps=0, weight_decay=0.0,
                            b2=0.999, grad_clip_norm=1.0)
    # One dispatch per batch of completions: steps_per_dispatch is rl.inner_steps (experiments/grpo.py checks it).
    config.train.update(batch_size=16, num_steps=200, log_every=5, checkpoint_every=50, steps_per_dispatch=1)
    config.sample.update(prompt="12345", max_new_tokens=0, temperature=0.0)

    if variant == "reverse":
        config.model.update(num_layers=4, num_heads=4, num_kv_heads=4, embed_dim=128)
        config.data.update(tokenizer="bytes", context_length=64, max_records=5000)
        config.rl.update(max_new_tokens=10, group_size=8, temperature=0.5, format_pattern=r" \d+")
        config.optimizer.update(learning_rate=5e-5, min_learning_rate=5e-5, schedule="constant")
        config.train.update(batch_size=8, num_steps=150, log_every=10, checkpoint_every=50)
        config.eval.update(every=25, batch_size=128, num_prompts=256)
        config.sample.update(prompt="12345", max_new_tokens=8)
    elif variant == "gsm8k":
        config.model.update(num_layers=12, num_heads=12, num_kv_heads=12, embed_dim=768)
        config.data.update(source="files:gsm8k/train.jsonl.gz", val_source="files:gsm8k/test.jsonl",
                           prompt_field="question")
        config.rl.update(max_new_tokens=256, group_size=8)
        config.eval.update(every=50, batch_size=64, num_prompts=256)
        config.sample.update(prompt="Natalia sold clips to 48 of her friends in April, and then she sold half as "
                                    "many clips in May. How many clips did Natalia sell altogether in April and May?",
                             max_new_tokens=256)
    elif variant == "test":
        config.model.update(num_layers=2, num_heads=2, num_kv_heads=2, embed_dim=32)
        config.data.update(tokenizer="bytes", context_length=40, max_records=64)
        config.rl.update(max_new_tokens=8, group_size=4)
        config.optimizer.update(learning_rate=1e-3, min_learning_rate=1e-3)
        config.train.update(batch_size=4, num_steps=4, log_every=2, checkpoint_every=4)
        config.eval.update(every=2, batch_size=8, num_prompts=8)
    else:
        raise ValueError(f"unknown variant {variant!r} of configs/grpo.py: use {', '.join(VARIANTS)}")
    return config
