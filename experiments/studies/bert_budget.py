"""The budget the BERT pretrained-vs-scratch studies share (docs/bert.md#pretrained-vs-scratch): the config,
the encoder they start from, the seeds, and the CPU studies' steps, row length and eval cadence. Each sweep file
of experiments/studies/bert_{sst2,stsb,conll2003,squad}/ states only what differs: its task, its arms, an ablation's
own overrides. Not a sweep file: the sweep files import it.

Every study fine-tunes configs/bert_finetune.py:<task> (BERT-Mini; its batch of 32 rows and learning rate of
1e-4 unless a sweep file says otherwise) from the encoder of configs/bert.py:mini, trained first,

  lm train --config=configs/bert.py:mini --workdir=runs/bert_mini

and from random initialisation (init_from=""), with SEEDS. The accelerator studies keep the config's own
budget and start from the finished run; the CPU studies (cpu_budget) run a few hundred steps and start from
the encoder's checkpoints halfway (HALFWAY, step 1000 of 2000) and finished (FINISHED, step 2000).
"""

PRETRAINED = "runs/bert_mini"  # the pretraining run (its latest checkpoint), relative to the repository root
HALFWAY = f"{PRETRAINED}/checkpoints/1000"
FINISHED = f"{PRETRAINED}/checkpoints/2000"
SCRATCH = ""  # no init_from: the encoder starts from random initialisation
SEEDS = (0, 1, 2)


def config(task: str) -> str:
    """The config spec of a task's studies."""
    return f"configs/bert_finetune.py:{task}"


def pretrained_vs_scratch(*encoders: str) -> dict[str, list]:
    """AXES: init_from each of the pretrained encoders, then from scratch; each with every seed."""
    return {"init_from": [*encoders, SCRATCH], "seed": list(SEEDS)}


def cpu_budget(steps: int, max_seq_len: int = 64, evals: int = 2, **data) -> dict:
    """OVERRIDES of a CPU study: `steps` steps of rows of max_seq_len pieces (and the other data.* options
    given; the fine-tuning schedule follows the run: warmup over a tenth of them, decay over all), the dev
    scores every steps / evals steps (evals=0: only once, after the last step), one checkpoint at the end."""
    return {
        "data.max_seq_len": max_seq_len,
        **{f"data.{key}": value for key, value in data.items()},
        "train.num_steps": steps,
        "eval.every": steps // evals if evals else 0,
        "train.checkpoint_every": steps,
    }
