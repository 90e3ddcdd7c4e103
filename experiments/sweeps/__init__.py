"""Sweep definitions for lm.sweep: each module holds CONFIG, AXES and OVERRIDES, and its docstring the
command that runs it and the one that compares its arms. They are read by path, never imported:

  python -m lm.sweep --sweep_file=experiments/sweeps/norm_position.py --workdir=runs/norm_position
"""
