"""lm: a JAX/Flax research training framework."""

__version__ = "0.1.0"
