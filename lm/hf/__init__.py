"""Hugging Face checkpoints in and out, at the file boundary (safetensors and config.json; no torch).

  files.py       a model folder: config.json, model.safetensors or shards with their index
  mapping.py     rules between Hugging Face tensors and lm parameters, and the config fields a
                 config.json implies (written once, used both ways)
  gpt2.py, llama.py, vit.py, bert.py   one module per architecture: ARCHITECTURES (transformers' class names),
                 EXPERIMENT (the lm experiment), lm_fields(config.json), rules, hf_config(lm config) for the
                 ones lm exports (and bert's save_tokenizer: the run's WordPiece vocabulary; gpt2's
                 lm_limits: the longest data.context_length its position table holds)
  source.py      HFSource: init_from=hf:DIR, a ParamSource (lm/train/init_from.py)
  export.py      a run's parameters and config as a Hugging Face folder (lm export)

How a run's config relates to config.json: it is checked, not changed. Every lm field the
checkpoint implies (lm_fields) must hold in the run's config, and those it bounds (lm_limits) stay
within; the ones that differ are one error line naming each field, both values and the flags that fix
it. See docs/huggingface.md.
"""

from lm.hf import bert, gpt2, llama, vit

MODULES = (gpt2, llama, vit, bert)
ARCHITECTURES = {name: module for module in MODULES for name in module.ARCHITECTURES}
# the experiments whose model is lm's GPT: pretraining, supervised fine-tuning, DPO
LANGUAGE_MODELS = ("language_model", "sft", "dpo", "grpo")
# experiment -> the architectures it exports as, in order of preference
EXPORTS = {**dict.fromkeys(LANGUAGE_MODELS, (gpt2, llama)), "image_classification": (vit,), "masked_lm": (bert,)}
