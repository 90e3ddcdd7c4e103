"""μTransfer, part 2 of 2: the grid of mutransfer_standard.py under μP, base width 32 (where the two
parametrizations are the same model).

  lm sweep --sweep_file=experiments/studies/mutransfer/mutransfer_mup.py --workdir=runs/mutransfer_mup

4 widths x 7 learning rates = 28 runs of 200 steps.
"""

from experiments.studies.mutransfer.mutransfer_standard import AXES, CONFIG
from experiments.studies.mutransfer.mutransfer_standard import OVERRIDES as STANDARD

OVERRIDES = {**STANDARD, "model.parametrization": "mup", "model.mup_base_width": 32}
__all__ = ["AXES", "CONFIG", "OVERRIDES"]
