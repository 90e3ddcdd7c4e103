"""Learned vs sinusoidal vs RoPE vs ALiBi positions in the baby model (4 layers, context 64).

  python -m lm.sweep --sweep_file=experiments/sweeps/positions.py --workdir=runs/positions
  python -m lm.compare runs/positions

4 arms x 3 seeds = 12 runs of 2000 steps.

Not covered yet: the issue also asks for the val loss at 2x the training context length (128 tokens),
where learned positions have no embedding and RoPE/ALiBi are expected to extrapolate. That needs an
eval option (an eval context length) in the trainer, which is not there yet; once it is, add it to
OVERRIDES here (e.g. "eval.context_length": 128) and let lm.compare report it.
"""

CONFIG = "configs/gpt_shakespeare.py:baby"
AXES = {
    "model.position": ["learned", "sinusoidal", "rope", "alibi"],
    "seed": [0, 1, 2],
}
OVERRIDES = {}
