"""The optimizer and train sections every config shares (lm/train/optim.py and lm/train/loop.py
read them); configs pass what differs from these defaults."""

import ml_collections


def run_options(experiment: str, **overrides) -> ml_collections.ConfigDict:
    """The top of every config: the experiment module (experiments/<name>.py), the seed, and where
    the parameters start from."""
    config = ml_collections.ConfigDict()
    config.experiment = experiment
    config.seed = 0
    # Start from another run's parameters (fine-tuning): its workdir, checkpoint folder or one step's
    # folder there. Loaded by name into this model at step 0 (a resumed run ignores it); parameters the
    # source lacks keep their fresh initialisation, the ones this model lacks are dropped; stacked or
    # unrolled layers convert to this model's layout. See lm/train/init_from.py.
    config.init_from = ""
    # Renamed source subtrees for init_from: "source/prefix:this/prefix,..."; an empty right side
    # leaves that subtree out (e.g. "lm_head:" for a head of another vocabulary).
    config.init_from_rename = ""
    config.update(overrides)
    return config


def optimizer_options(**overrides) -> ml_collections.ConfigDict:
    """AdamW with global-norm clipping; linear warmup, then cosine decay to min_learning_rate."""
    options = ml_collections.ConfigDict()
    options.learning_rate = 1e-3  # peak, after warmup
    options.min_learning_rate = 1e-5  # reached at decay_steps, then held
    options.warmup_steps = 100
    options.decay_steps = 2000
    options.b1 = 0.9
    options.b2 = 0.999
    options.weight_decay = 0.0  # decoupled (AdamW), on matrices only
    options.grad_clip_norm = 1.0  # the global norm gradients are scaled down to
    options.update(overrides)
    return options


def train_options(**overrides) -> ml_collections.ConfigDict:
    """Batch, length of the run, logging and checkpointing."""
    options = ml_collections.ConfigDict()
    options.batch_size = 128  # examples, global across all devices and hosts
    options.num_steps = 2000
    options.grad_accum_steps = 1  # micro-batches per step (batch_size is split into them)
    options.log_every = 100
    options.checkpoint_every = 1000
    options.keep_checkpoints = 2
    # Where checkpoints go; "" = <workdir>/checkpoints. A gs:// path (Orbax writes it directly) or a
    # mounted Google Drive folder keeps them when a Colab runtime or a preemptible VM goes away.
    options.checkpoint_dir = ""
    # A latest checkpoint that cannot be read stops the run with a message; True resumes from the one
    # before it instead (the damaged one is kept, renamed <step>.corrupt).
    options.restore_fallback = False
    # A step whose loss or gradients are NaN/Inf never updates the weights; then "stop": end the run
    # with a message (nothing saved after that step); "skip": go on and count it (skipped_steps).
    options.on_nonfinite = "stop"
    # How many global batches a background thread loads and places on the devices ahead of the
    # step (the host pipeline and the copy overlap the step before); 0 = load each in the step's turn.
    # The batches are the same either way.
    options.prefetch = 2
    # Train steps per dispatch from the host: k > 1 runs k steps in one program (a scan over k
    # batches) where no log, eval or checkpoint step falls between, for small models whose steps are
    # shorter than the host's time to launch one. Same batches, same updates as k = 1.
    options.steps_per_dispatch = 1
    # Where compiled programs are stored and reused by later runs and restarts (JAX's persistent
    # compilation cache: programs that took at least 1 s to compile, written by process 0).
    # "auto" = $JAX_COMPILATION_CACHE_DIR, else ~/.cache/lm/jax_compilation_cache ($XDG_CACHE_HOME);
    # "none" = no cache; or a folder.
    options.compilation_cache_dir = "auto"
    options.peak_flops = 0.0  # per device, for MFU; 0 = a known accelerator's data sheet, else (CPUs) no MFU
    options.wandb_project = ""  # non-empty turns Weights & Biases logging on
    options.update(overrides)
    return options
