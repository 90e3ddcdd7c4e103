"""Sweep definitions for lm sweep: each module holds CONFIG, AXES and OVERRIDES, and its docstring the
command that runs it and the one that compares its arms. lm sweep reads them by path; a sweep file may
import another, or bert_budget.py (the budget the BERT studies share, not a sweep file):

  lm sweep --sweep_file=experiments/sweeps/norm_position.py --workdir=runs/norm_position
"""
