"""Standard zero-shot tasks scored like lm-evaluation-harness (docs/evaluation.md).

  tasks.py    each task as the harness defines it (prompt, target delimiter, choices, gold; its metrics), read
              from $LM_DATA_DIR
  scoring.py  log-likelihoods of (context, continuation) pairs as the harness's Hugging Face model computes them
              (its pair tokenisation, the cut from the left, is_greedy; rolling windows), in length-bucketed,
              jitted batches
  models.py   what is scored: an lm run's GPT or a Hugging Face folder (GPT-2, Llama), with its tokenizer
  passkey.py  passkey:LENGTH, synthetic passkey retrieval: a key hidden in filler LENGTH tokens long
  report.py   all the tasks of one model: the table (task, metric, value, stderr) and eval.json
  benchmarks.py  eval.benchmarks: tasks scored during training, one trainer evaluator each (hellaswag_acc_norm, ...)
"""
