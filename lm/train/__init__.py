"""The generic trainer: state, pure steps, the loop, checkpoints and metric writers."""
