"""Decoding from trained models: sampling with a KV cache (generate.py), batched completions of ragged prompts for
online RL (rollout.py), greedy and beam search (search.py)."""
