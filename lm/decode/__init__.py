"""Decoding from trained models: sampling with a KV cache (generate.py), greedy and beam search (search.py)."""
