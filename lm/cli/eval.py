"""Evaluate a run's checkpoint."""
