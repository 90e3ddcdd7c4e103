"""The sections every config shares: the run's top keys, optimizer, train (lm/train/optim.py and
lm/train/loop.py read them) and mesh; configs pass what differs from these defaults. Each key is declared
with its description (lm/layers/options.py `declare`), which `lm train --print_config` lists."""

import math

import ml_collections

from lm.layers.options import SHARE_BELOW_ONE, Range, above, at_least, declare, option

NONFINITE_POLICIES = ("stop", "skip")  # train.on_nonfinite: end the run, or skip the update and go on
OPTIMIZERS = ("adamw", "muon", "adafactor", "lion", "sgd")  # optimizer.name (lm/train/optim.py update_rule)
SCHEDULES = ("cosine", "wsd", "linear", "constant")  # optimizer.schedule (lm/train/optim.py learning_rate_schedule)
DECAY_SHAPES = ("linear", "cosine", "1-sqrt")  # optimizer.decay_shape: how WSD's decay falls
DERIVED = -1  # optimizer.warmup_steps / decay_steps, eval.every: from the run (lm/train/optim.py resolve_schedule)
ALL_LEFT = at_least(1, -1)  # a mesh axis: a number of devices, or -1: all that the other axes leave
EVALUATIONS_PER_RUN = 8  # a derived eval.every gives a run this many evaluations, or up to twice as many


def derived_eval_every(num_steps: int) -> int:
    """eval.every for a run of num_steps steps: num_steps / EVALUATIONS_PER_RUN rounded down to a readable
    interval (1, 2, 2.5 or 5 times a power of ten, a whole number: 250 for 2000 steps, 10 for 120), at least 1."""
    target = num_steps / EVALUATIONS_PER_RUN
    if target < 1:
        return 1
    power = 10 ** math.floor(math.log10(target))
    readable = [m * power for m in (1, 2, 2.5, 5) if m * power <= target and float(m * power).is_integer()]
    return int(max(readable))


def eval_every_option(what: str):
    """The declared eval.every of an experiment family: steps between its evaluations (`what`), derived from
    train.num_steps unless set (resolve_schedule)."""
    return option(DERIVED, f"steps between {what}; {DERIVED}: about an eighth of train.num_steps (8 to 16 "
                           "evaluations a run: lm/train/options.py derived_eval_every); 0: none while training",
                  bounds=at_least(0, DERIVED))


def run_options(experiment: str, **overrides) -> ml_collections.ConfigDict:
    """The top of every config: the experiment module (experiments/<name>.py), the seed, and where
    the parameters start from."""
    config = declare(
        ml_collections.ConfigDict(),
        experiment=option(experiment, "the experiment module: a built-in's name (experiments/<name>.py) or a "
                                      "dotted module path"),
        seed=option(0, "seeds the parameters' initialisation, dropout and the data order",
                    bounds=at_least(0)),
        # Loaded by name into this model at step 0 (a resumed run ignores it); parameters the source lacks
        # keep their fresh initialisation, the ones this model lacks are dropped; stacked or unrolled layers
        # convert to this model's layout. See lm/train/init_from.py.
        init_from=option("", "start from another run's parameters (fine-tuning): its workdir, checkpoint folder "
                             "or one step's folder there, or hf:DIR (a Hugging Face folder)"),
        init_from_rename=option("", "renamed source subtrees for init_from: 'source/prefix:this/prefix,...'; an "
                                    "empty right side leaves the subtree out (e.g. 'lm_head:')"),
        init_from_config=option(False, "with init_from=hf:DIR, take the model section (and data.vocab_size, and "
                                       "data.context_length where it is longer) from DIR's config.json instead of "
                                       "checking this config against it"),
        init_from_adapters=option("", "a peft LoRA folder (adapter_config.json, adapter_model.safetensors) whose "
                                      "adapters go onto the parameters init_from loads; needs model.lora.rank "
                                      "(docs/post-training.md)"),
    )
    config.update(overrides)
    return config


def optimizer_options(**overrides) -> ml_collections.ConfigDict:
    """An optimizer by name (AdamW by default) after global-norm clipping; a linear warmup, then a schedule by
    name (cosine decay to min_learning_rate by default)."""
    options = declare(
        ml_collections.ConfigDict(),
        name=option("adamw", "the update rule (lm/train/optim.py): adamw; muon (Muon on the blocks' matrices, "
                             "AdamW on the rest); adafactor (factored second moments); lion; sgd (Nesterov "
                             "momentum)", choices=OPTIMIZERS),
        schedule=option("cosine", "the learning rate after the warmup: cosine or linear decay to min_learning_rate "
                                  "at decay_steps; constant; wsd: constant (stable), then its last decay_fraction "
                                  "decays (decay_shape)", choices=SCHEDULES),
        learning_rate=option(1e-3, "the peak learning rate, reached at the end of warmup",
                             bounds=at_least(0)),
        min_learning_rate=option(1e-5, "the learning rate the decay ends at (decay_steps), then held",
                                 bounds=at_least(0)),
        # The schedule's lengths: a resumed run keeps the lengths its config.json records;
        # lm/train/optim.py resolve_schedule fills them in, and config.json holds the resolved values.
        warmup_steps=option(DERIVED, f"steps of linear warmup from 0; {DERIVED}: warmup_fraction of decay_steps",
                            bounds=at_least(0, DERIVED)),
        warmup_fraction=option(0.05, f"the warmup's share of decay_steps where warmup_steps is {DERIVED}",
                               bounds=SHARE_BELOW_ONE),
        decay_steps=option(DERIVED, f"steps until the decay reaches min_learning_rate; {DERIVED}: train.num_steps "
                                    "(wsd: always the current one, so that a run given more steps decays at its "
                                    "new end)", bounds=at_least(1, DERIVED)),
        decay_fraction=option(0.2, "wsd: the decay's share of decay_steps, at its end (the stable phase before it)",
                              bounds=Range(0, 1, low_open=True)),
        decay_shape=option("linear", "wsd: how the decay falls to min_learning_rate: linearly, along a half cosine, "
                                     "or 1-sqrt (fast at first)", choices=DECAY_SHAPES),
        b1=option(0.9, "Adam's (and Lion's) decay rate of the gradients' moving average", bounds=SHARE_BELOW_ONE),
        b2=option(0.999, "Adam's decay rate of the squared gradients' moving average (Lion's of its momentum)",
                  bounds=SHARE_BELOW_ONE),
        weight_decay=option(0.0, "decoupled weight decay (times the learning rate, as AdamW's), on matrices and "
                                 "embeddings only, for every optimizer", bounds=at_least(0)),
        momentum=option(0.9, "sgd: the Nesterov momentum's decay rate", bounds=SHARE_BELOW_ONE),
        muon_learning_rate=option(0.02, "muon: the peak learning rate of the matrices Muon updates (the rest: "
                                        "learning_rate), on the same schedule", bounds=at_least(0)),
        muon_momentum=option(0.95, "muon: the decay rate of its Nesterov momentum", bounds=SHARE_BELOW_ONE),
        muon_params=option(r"block_\d+/.*kernel$", "muon: a regular expression (re.search) on the '/'-joined "
                                                   "parameter paths; the matrices it matches go to Muon, the "
                                                   "rest (embeddings, head, norms, biases) to AdamW"),
        grad_clip_norm=option(1.0, "the global norm that larger gradients are scaled down to",
                              bounds=above(0)),
    )
    options.update(overrides)
    return options


def train_options(**overrides) -> ml_collections.ConfigDict:
    """Batch, length of the run, logging and checkpointing."""
    options = declare(
        ml_collections.ConfigDict(),
        batch_size=option(128, "examples per step, global across all devices and hosts",
                          bounds=at_least(1)),
        num_steps=option(2000, "optimizer steps the run trains for (0: none; the initial parameters, e.g. those "
                               "init_from loaded, are saved as the checkpoint of step 0)", bounds=at_least(0)),
        grad_accum_steps=option(1, "micro-batches per step (batch_size is split into them)",
                                bounds=at_least(1)),
        log_every=option(100, "steps between progress lines and metric records", bounds=at_least(1)),
        checkpoint_every=option(1000, "steps between checkpoints (one is also saved at the end)",
                                  bounds=at_least(1)),
        keep_checkpoints=option(2, "how many of the latest checkpoints are kept",
                                  bounds=at_least(1)),
        checkpoint_dir=option("", "where checkpoints go; '' = <workdir>/checkpoints; a gs:// path or a mounted "
                                  "Google Drive folder outlives a Colab runtime or a preemptible VM"),
        restore_fallback=option(False, "a latest checkpoint that cannot be read or fails its checksums stops the "
                                       "run; True resumes from the newest one before it that verifies (damaged "
                                       "ones kept, renamed <step>.corrupt; with none left the run stops too)"),
        on_nonfinite=option("stop", "a step with NaN/Inf loss or gradients never updates the weights; then stop: "
                                    "end the run with a message; skip: go on and count it (skipped_steps)",
                            choices=NONFINITE_POLICIES),
        prefetch=option(2, "global batches a background thread loads and places on the devices ahead of the "
                           "step; 0 = load each in the step's turn (the batches are the same either way)",
                        bounds=at_least(0)),
        steps_per_dispatch=option(0, "train steps per dispatch from the host: k > 1 runs k steps in one program "
                                     "where no log, eval or checkpoint falls between (same updates as 1); 0 = "
                                     "enough steps for ~10 ms at 40% of the devices' peak, at most 16, a divisor of "
                                     "the log/eval/checkpoint intervals (1 where the peak is unknown: a CPU)",
                                  bounds=at_least(0)),
        compilation_cache_dir=option("auto", "JAX's persistent compilation cache: auto = $JAX_COMPILATION_CACHE_DIR, "
                                             "else ~/.cache/lm/jax_compilation_cache; none = no cache; or a folder"),
        peak_flops=option(0.0, "peak FLOP/s per device, for MFU; 0 = a known accelerator's data sheet, else no MFU",
                          bounds=at_least(0)),
        wandb_project=option("", "a Weights & Biases project to log to ('' = no W&B logging)"),
        profile=option("", "START:STOP traces the steps after step START up to step STOP (whole dispatches) with "
                           "jax.profiler into <workdir>/profile/process_<i>, for TensorBoard and Perfetto "
                           "(docs/performance.md); '' = no trace"),
    )
    options.update(overrides)
    return options


def mesh_options() -> ml_collections.ConfigDict:
    """The mesh axis sizes (lm/sharding.py MESH_AXES); one device is a 1x1x1x1x1 mesh."""
    return declare(
        ml_collections.ConfigDict(),
        data=option(-1, "devices the batch is split over, data parallel (-1: all that the other axes leave)",
                    bounds=ALL_LEFT),
        fsdp=option(1, "devices the parameters and optimizer state are sharded over, and the batch (FSDP)",
                    bounds=ALL_LEFT),
        expert=option(1, "devices the experts of mixture-of-experts layers are split over, and the batch",
                      bounds=ALL_LEFT),
        context=option(1, "devices the sequence dimension of the activations is split over (context parallel: "
                          "model.context_parallel: how attention spans it; docs/long-context.md)", bounds=ALL_LEFT),
        tensor=option(1, "devices the heads, MLP and vocabulary dimensions are split over (tensor parallel)",
                      bounds=ALL_LEFT),
    )
