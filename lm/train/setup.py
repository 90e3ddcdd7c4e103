"""Building a run: the experiment, the mesh, the optimizer and the sharded train state, from a config.

build(config, make_experiment, devices) checks what can be checked before anything compiles (the mesh
against the devices and the batch, the trainer's options), builds the experiment with make_experiment
(the build of its module, which the `lm` command hands over: this layer never imports experiments) and
returns a Setup; the trainer (lm.train.loop), the dry run (lm.train.dry_run), `lm eval`
(lm.train.evaluate), the benchmarks and the inference commands (restore_params) build from it.
"""

import contextlib
import dataclasses
import itertools
import os
import pathlib
import sys
from collections.abc import Callable, Iterator

import flax.linen as nn
import jax
import ml_collections
import optax
from jax.experimental.compilation_cache import compilation_cache
from jax.sharding import Mesh

from lm import sharding
from lm.errors import UserError
from lm.layers.attention import chunks_per_device
from lm.runs import CHECKPOINTS_DIR
from lm.train.checkpoint import Checkpointer
from lm.train.experiment import Experiment
from lm.train.optim import logged_learning_rates, make_optimizer, resolve_schedule, schedule_warning
from lm.train.profile import profile_window
from lm.train.state import TrainState
from lm.train.step import make_multi_step, make_train_step


@dataclasses.dataclass(frozen=True)
class Setup:
    """What a run is built from (build() makes it)."""

    config: ml_collections.ConfigDict
    mesh: Mesh
    rules: list[tuple]  # logical axis name -> mesh axes (flax.linen.logical_axis_rules)
    experiment: Experiment
    optimizer: optax.GradientTransformation
    init_boxed: Callable[[jax.Array], TrainState]  # rng -> the step-0 state, params boxed with their axis names

    def abstract_state(self) -> tuple[TrainState, TrainState]:
        """(shapes with their shardings, shardings) of the state: see abstract_state."""
        return abstract_state(self.init_boxed, jax.random.key(self.config.seed), self.mesh, self.rules)

    def init_state(self, state_shardings: TrainState) -> TrainState:
        return init_state(self.init_boxed, jax.random.key(self.config.seed), state_shardings)

    def jit_train_step(self, state_shardings: TrainState):
        return jit_train_step(self.config, self.experiment, self.optimizer, state_shardings, self.mesh)

    def train_data(self, start_step: int):
        return process_train_data(self.config, self.experiment, self.mesh, start_step)


# An experiment module's build(config, workdir): workdir is the run folder (None outside a run), where it
# finds what an earlier attempt of the run saved (its tokenizer, its data cache).
MakeExperiment = Callable[[ml_collections.ConfigDict, pathlib.Path | None], Experiment]


def prepare_directory(directory: str, option: str = "--workdir") -> pathlib.Path:
    """Creates directory if needed and checks that this process can write there; option names the
    flag or config field it came from, for the error."""
    path = pathlib.Path(directory).expanduser().absolute()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write_probe_{jax.process_index()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UserError(f"{path} is not writable ({e.strerror}); pass a {option} you can write to") from e
    return path


@contextlib.contextmanager
def prepared_directory(directory: str, option: str = "--workdir") -> Iterator[pathlib.Path]:
    """prepare_directory(directory, option) for the block; when the block raises (a check failed), the
    folders created here (directory and its missing parents) are removed again while they are empty, so
    that a run stopped before it wrote anything leaves the filesystem as it was."""
    path = pathlib.Path(directory).expanduser().absolute()
    created = list(itertools.takewhile(lambda folder: not folder.exists(), (path, *path.parents)))
    try:
        yield prepare_directory(directory, option)
    except BaseException:
        for folder in created:  # the deepest first
            try:
                folder.rmdir()
            except OSError:  # not empty: something was written there (or never created)
                break
        raise


def default_compilation_cache() -> str:
    """$JAX_COMPILATION_CACHE_DIR if set, else a per-user folder: $XDG_CACHE_HOME/lm/jax_compilation_cache
    (~/.cache/lm/jax_compilation_cache)."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return os.environ["JAX_COMPILATION_CACHE_DIR"]
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache_home, "lm", "jax_compilation_cache")


def use_compilation_cache(directory: str) -> str:
    """Points JAX's persistent compilation cache at directory, so that compiled programs are stored
    there and reused by later runs and restarts; returns the folder in use ("" for none).

    "auto" (the default) is default_compilation_cache(); when that folder cannot be written the run
    goes on without a cache (with a warning). "none" or "" turns the cache off. Any other directory is
    created, and one this process cannot write to is a UserError. JAX opens its cache once per
    process, at the first compile that uses it, and then ignores changes to the directory: so when the
    directory differs from the one set, the cache is also reset and the next compile opens the new
    one (programs this process compiled before stay in its memory; a notebook that trains again with
    another directory switches to it). JAX writes only programs that took
    jax_persistent_cache_min_compile_time_secs (default 1 s) or more to compile, and only from
    process 0."""
    if directory in ("", "none"):
        jax.config.update("jax_enable_compilation_cache", False)
        return ""
    if directory == "auto":
        try:
            path = str(prepare_directory(default_compilation_cache(), "--config.train.compilation_cache_dir"))
        except UserError as e:
            print(f"warning: no compilation cache: {e}", file=sys.stderr)
            return use_compilation_cache("none")
    else:
        path = str(prepare_directory(directory, "--config.train.compilation_cache_dir"))
    jax.config.update("jax_enable_compilation_cache", True)
    if jax.config.jax_compilation_cache_dir != path:
        jax.config.update("jax_compilation_cache_dir", path)
        compilation_cache.reset_cache()
    return path


def abstract_state(init_boxed, rng, mesh, rules):
    """The state's shapes, dtypes and NamedShardings (from the logical axis names), no compute."""
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        shardings = sharding.logical_shardings(jax.eval_shape(init_boxed, rng), mesh, rules)
        shapes = jax.eval_shape(lambda r: nn.unbox(init_boxed(r)), rng)
    sharding.check_divisible(shapes, shardings)
    return jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings
    ), shardings


def state_builder(experiment: Experiment, optimizer):
    """rng -> TrainState at step 0, with params still boxed with their logical axis names."""

    def init_boxed(rng):
        params = experiment.init(rng)["params"]
        step = jax.numpy.zeros((), jax.numpy.int32)
        return TrainState(step=step, params=params, opt_state=optimizer.init(params))

    return init_boxed


def init_state(init_boxed, rng: jax.Array, state_shardings) -> TrainState:
    """The step-0 TrainState, created directly in its shardings."""
    return jax.jit(lambda r: nn.unbox(init_boxed(r)), out_shardings=state_shardings)(rng)


def jit_train_step(config: ml_collections.ConfigDict, experiment: Experiment, optimizer, state_shardings, mesh):
    """The jitted (state, (global batch, ...)) -> (state, metrics) program the trainer runs: one train
    step per batch of the tuple (train.steps_per_dispatch of them, fewer before a log, eval or
    checkpoint step), the metrics stacked (n,), the state donated."""
    learning_rates = logged_learning_rates(config.optimizer, config.get("model"))
    return jax.jit(
        make_multi_step(make_train_step(experiment.loss, optimizer, learning_rates, config.train.grad_accum_steps,
                                        config.seed)),
        in_shardings=(state_shardings, sharding.batch_sharding(mesh)),
        out_shardings=(state_shardings, None),
        donate_argnums=0,
    )


def process_train_data(config: ml_collections.ConfigDict, experiment: Experiment, mesh, start_step: int):
    """This process's rows of every global training batch from batch number start_step on (see
    Experiment.train_data); sharding.assemble_batch makes global arrays of them."""
    shard = sharding.process_batch_shard(mesh)
    return experiment.train_data(config.train.batch_size // shard[1], config.seed, shard, start_step)


def checkpoint_directory(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> str:
    """config.train.checkpoint_dir (a local path, or a URL such as gs://bucket/run for Orbax), or
    by default workdir/checkpoints."""
    chosen = config.train.get("checkpoint_dir", "")  # runs written before the option have none
    if "://" in chosen:
        return chosen
    local = pathlib.Path(chosen).expanduser() if chosen else pathlib.Path(workdir) / CHECKPOINTS_DIR
    return str(local.absolute())  # Orbax wants absolute paths


def restore_params(config: ml_collections.ConfigDict, experiment: Experiment, workdir: pathlib.Path,
                   step: int | None = None, mesh: jax.sharding.Mesh | None = None):
    """The params of the checkpoint at step (default: the latest) of the run in workdir, sharded over mesh as in
    training (default: on the first device)."""
    mesh = mesh or sharding.make_mesh({axis: 1 for axis in sharding.MESH_AXES}, jax.devices()[:1])
    rules = sharding.logical_rules(config.sharding_rules)
    init_boxed = state_builder(experiment, make_optimizer(resolve_schedule(config).optimizer, config.get("model")))
    state_shapes, _ = abstract_state(init_boxed, jax.random.key(config.seed), mesh, rules)
    directory = checkpoint_directory(config, workdir)
    checkpointer = Checkpointer(directory, config.train.keep_checkpoints)
    try:
        if step is None:
            restored = checkpointer.restore_latest(state_shapes, fallback=False)
            if restored is None:
                raise UserError(f"no checkpoint in {directory}: train first with lm train")
            return restored[1].params
        return checkpointer.restore_checked(step, state_shapes).params
    finally:
        checkpointer.close()


def build(config: ml_collections.ConfigDict, make_experiment: MakeExperiment,
          devices: list[jax.Device] | None, workdir: pathlib.Path | None = None) -> Setup:
    """The Setup of config on devices (default: all), its experiment from make_experiment(config, workdir)
    (the build of the module config.experiment names: the `lm` command resolves it), after checking that
    the mesh fits the devices and divides the batch; turns on (and names) the compilation cache of
    train.compilation_cache_dir, before anything is compiled. Its config is config with the schedule's
    lengths resolved (resolve_schedule, which first checks the config's declared choices and ranges), as the
    experiment holds it (experiment.config: with what it derived from its data); a
    schedule that does not end with the run is printed (one line); a train.profile window that is malformed or
    outside the run is a UserError (lm.train.profile.profile_window)."""
    config = resolve_schedule(config)  # first checks every declared choice and range (check_declared)
    profile_window(config.train.get("profile", ""), config.train.num_steps)  # (runs saved before it have none)
    cache = use_compilation_cache(config.train.compilation_cache_dir)
    print(f"compilation cache: {cache or 'off'}")
    if warning := schedule_warning(config.optimizer, config.train.num_steps):
        print(warning)
    mesh = sharding.make_mesh(config.mesh.to_dict(), devices)
    sharding.check_batch(config.train.batch_size, config.train.grad_accum_steps, mesh)
    sharding.check_context(config.get("data", {}).get("context_length"), mesh,
                           chunks_per_device(config.get("model", {}).get("context_parallel", "all_gather")))
    rules = sharding.logical_rules(config.sharding_rules)
    experiment = make_experiment(config, workdir)
    config = experiment.config  # with what it derived from its data (lm/train/experiment.py)
    optimizer = make_optimizer(config.optimizer, config.get("model"))
    return Setup(config, mesh, rules, experiment, optimizer, state_builder(experiment, optimizer))
