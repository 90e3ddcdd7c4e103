"""Train an experiment from a config.

  python -m lm.main --config=configs/gpt_shakespeare.py:baby --workdir=runs/baby \
      [--config.model.norm_position=post ...]

Rerunning the same command resumes from the latest checkpoint in --workdir. With --dry_run it builds
the mesh, compiles the train step and prints parameters, per-device memory and FLOPs per step, then
exits without training or writing anything.
"""

from absl import app, flags, logging
from ml_collections import config_flags

from lm.cli import define_workdir, parse_flags, run_user_errors
from lm.cpu import keep_freed_memory

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file and variant, e.g. configs/gpt_shakespeare.py:baby", lock_config=True
)
_WORKDIR = define_workdir("Run folder: config, checkpoints, logs, samples.")
flags.mark_flag_as_required("config")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Compile the train step for the mesh, print its memory and "
                             "FLOPs, and exit.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)  # Orbax logs every save at INFO
    keep_freed_memory()
    from lm.train.loop import dry_run, train  # after flag parsing, so --help and flag errors are quick

    if _DRY_RUN.value:
        run_user_errors(lambda: dry_run(_CONFIG.value))
    else:
        run_user_errors(lambda: train(_CONFIG.value, _WORKDIR.value))


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
