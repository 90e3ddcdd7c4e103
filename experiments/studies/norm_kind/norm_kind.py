"""LayerNorm vs RMSNorm in the baby model (4 layers, pre-norm): loss and step time.

  lm sweep --sweep_file=experiments/studies/norm_kind/norm_kind.py --workdir=runs/norm_kind
  lm compare runs/norm_kind

2 arms x 3 seeds = 6 runs of 2000 steps. Step times are only comparable between arms that ran on the
same machine with the same load: keep --parallel=1 on a shared machine.
"""

CONFIG = "configs/gpt_shakespeare.py:baby"
AXES = {
    "model.norm": ["layer", "rms"],
    "seed": [0, 1, 2],
}
OVERRIDES = {}
