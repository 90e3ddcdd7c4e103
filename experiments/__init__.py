"""The built-in experiments: one module per task, each with build(config) and from_workdir(config,
workdir) (lm/train/experiment.py). config.experiment names one by its short name (language_model,
translation, image_classification, masked_lm, finetune: lm/cli/resolve.py lists them); the `lm`
command imports only the one a run uses, so a command loads only its own experiment's libraries
(scipy for the BERT task metrics, sacrebleu for BLEU, ...)."""
