r"""Train an experiment from a config.

  lm train --config=configs/gpt_shakespeare.py:baby --workdir=runs/baby \
      [--config.model.norm_position=post ...]
  lm train --config=configs/gpt_shakespeare.py:baby --print_config [--config.model.norm=rms ...]

--config.KEY=VALUE overrides a key of the config; --print_config lists every key with its value, type,
allowed values and description, then exits (no --workdir needed). A mistake in the config file, its
variant, an override or a flag is one line, `error: ...` (exit code 2), before anything is written.

A finished run ends with one line: the eval loss at the last step, the held-out results and the run folder's
files ("done: eval loss 1.8818 at step 2000; outputs in runs/baby (checkpoints/, config.json, ...)").

Rerunning the same command resumes from the latest checkpoint in --workdir. The persistent compilation
cache is on by default (--config.train.compilation_cache_dir=auto: $JAX_COMPILATION_CACHE_DIR, else
~/.cache/lm/jax_compilation_cache; =DIR: another folder; =none: off), so a rerun reuses the programs
compiled before; the run's first line names the folder. With --dry_run it builds the mesh, compiles the
train step and prints parameters, per-device memory and FLOPs per step, then exits without training or
writing anything.

Multi-process (TPU pod slices, GPU clusters): every process runs the same command. On a pod slice,
under SLURM or Open MPI, jax.distributed finds the other processes itself; elsewhere give
--coordinator_address=host0:port --num_processes=N --process_id=i (launch/ has the scripts). Only
process 0 prints progress and writes logs; all of them write the checkpoints together.
"""

import logging as std_logging
import os
import signal
import sys
import threading

from absl import app, flags, logging

from lm.cli import define_string_once, parse_flags, reject_arguments
from lm.cli.overrides import config_listing, resolve_config, split_config_overrides
from lm.cpu import keep_freed_memory
from lm.errors import UserError, fail, run_user_errors

_CONFIG = define_string_once("config", "Config file and variant, e.g. configs/gpt_shakespeare.py:baby "
                             "(required); --config.KEY=VALUE overrides a key")
_WORKDIR = define_string_once("workdir", "Run folder: config, checkpoints, logs, samples (required but with "
                              "--print_config).")
_PRINT_CONFIG = flags.DEFINE_bool("print_config", False, "Print every config key (overrides applied) with its "
                                  "value, type, allowed values and description, and exit.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Compile the train step for the mesh, print its memory and "
                             "FLOPs, and exit.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0, for a multi-process "
                                   "run started by hand (default: $JAX_COORDINATOR_ADDRESS, or the launcher's)")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "How many processes take part (default: "
                                      "$JAX_NUM_PROCESSES, or the launcher's)")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index, 0 to num_processes - 1 "
                                   "(default: $JAX_PROCESS_ID, or the launcher's)")


_OVERRIDES: dict[str, str] = {}  # the --config.key=value arguments, set aside from absl's flags


def parse_train_flags(argv: list[str]) -> list[str]:
    """absl's flags of the command line; its --config.key=value overrides go to _OVERRIDES."""
    rest, overrides = split_config_overrides(argv)
    _OVERRIDES.clear()
    _OVERRIDES.update(overrides)
    return parse_flags(rest)


def command_config():
    """The config of --config with the overrides; a missing flag or a bad config is a UserError."""
    if not _CONFIG.value:
        raise UserError("pass --config=FILE:VARIANT, e.g. --config=configs/gpt_shakespeare.py:baby")
    return resolve_config(_CONFIG.value, _OVERRIDES)


def main(argv: list[str]) -> None:
    reject_arguments(argv)
    config = run_user_errors(command_config)
    if _PRINT_CONFIG.value:
        print(config_listing(config))
        return
    if not (_WORKDIR.value or "").strip():
        fail("pass --workdir=DIR, the run folder (a rerun of the same command resumes from it)")
    logging.set_verbosity(logging.WARNING)  # Orbax logs every save at INFO
    # A checkpoint write that fails (a full disk, a read-only or removed folder) is one line of the
    # trainer's, which says what happened and what is intact (lm.train.checkpoint.write_failed). Orbax's
    # threads log the failure too, with pages of tracebacks, and asyncio reports the tasks it drops at exit.
    logging.get_absl_logger().addFilter(lambda record: f"{os.sep}orbax{os.sep}" not in record.pathname)
    std_logging.getLogger("asyncio").setLevel(std_logging.CRITICAL)
    keep_freed_memory()
    run_user_errors(start_processes)
    # after flag parsing, so --help and flag errors are quick
    from lm.cli.resolve import find_experiment
    from lm.train.checkpoint import quiet_failed_writes
    from lm.train.dry_run import dry_run
    from lm.train.loop import Stopped, train

    quiet_failed_writes()  # (with the filters above)
    experiment = run_user_errors(lambda: find_experiment(config.experiment))
    if _DRY_RUN.value:
        run_user_errors(lambda: dry_run(config, experiment.build))
        return
    try:
        run_user_errors(lambda: train(config, _WORKDIR.value, experiment.build))
    except Stopped as e:  # SIGTERM or SIGINT: the checkpoint is saved; the exit code says why it ended
        print(e, file=sys.stderr)
        sys.exit(128 + signal.Signals[e.signal_name].value)


def start_processes() -> None:
    """jax.distributed when this is one of several processes. The others' stdout (progress lines) is
    dropped, so the log shows each line once; their stderr (warnings, errors) stays."""
    from lm import distributed

    role = distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    if role is None:
        return
    print(f"multi-process run: {role}", file=sys.stderr)
    if not distributed.is_primary():
        sys.stdout = open(os.devnull, "w")  # for the life of the process


def run() -> None:
    """The command: flags from sys.argv, then main. A run that failed ends at once, even while a thread
    still writes a checkpoint (one Checkpointer.close gave up waiting for: a hung filesystem), which
    Python would wait for without end."""
    try:
        app.run(main, flags_parser=parse_train_flags)
    except SystemExit as e:
        others = [thread for thread in threading.enumerate() if thread is not threading.main_thread()]
        if e.code and any(not thread.daemon for thread in others):
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(e.code if isinstance(e.code, int) else 1)
        raise
