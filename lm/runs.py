"""A run folder: the files `lm train` writes there (lm/cli/resolve.py reopens a run for the inference
commands)."""

CONFIG_FILE = "config.json"  # the resolved config
METRICS_FILE = "metrics.jsonl"  # one JSON object per logged step: train or eval scalars
SUMMARY_FILE = "summary.json"  # the last eval metrics and run facts (parameters, compile and train time)
RESULTS_FILE = "results.json"  # the experiment's held-out results, written once training is done
DATA_CACHE_DIR = "data_cache"  # the tokenised corpus, for a resumed run (lm/data/run_cache.py)
