"""The measured studies, one folder each: its sweep files, a README.md with the question, the commands, the result
and the figure, and its small result files (lm compare's report.md and plots). A sweep file holds CONFIG, AXES and
OVERRIDES for lm sweep, which reads it by path, and its docstring the command that runs it and the one that compares
its arms; it may import another sweep file, or what several studies share (bert_budget.py, bert_curve.py: not sweep
files):

  lm sweep --sweep_file=experiments/studies/norm_position/norm_position.py --workdir=runs/norm_position
"""
