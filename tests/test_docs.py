"""The commands of README.md and of docs/ (its pages at any depth) run as written, in a cheap mode: every
`lm <command> ...` (or `python -m lm ...`) line of their code blocks names a command that exists and only flags
that command defines; an `lm train` or `lm sweep` line's config loads with its --config.* overrides, and a sweep's
arms (its --sweep axes or --sweep_file) check out, as they do before anything trains
(lm.cli.overrides.resolve_config, lm.cli.sweep.plan_sweep); a `python <file>.py` line names a file that
exists; a `pip install -e ".[extra]"` names extras pyproject.toml defines. Data paths, run folders and
hf:DIR need not exist, and a usage line's placeholders (--text=FILE) pass: flag names are checked, the
values of flags other than --config.* and --sweep* are not. Nothing is trained or compiled.

The documentation site builds with `mkdocs build --strict` (a broken link or anchor, or a page left out of
the nav, fails it), README.md stays a front page of at most 150 lines, and neither speaks of how lm was
made (issue numbers, sessions, our machines)."""

import ast
import importlib
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import tomllib

import pytest
from absl import flags
from conftest import REPO

from lm import cli
from lm.cli import sweep
from lm.cli.overrides import parse_axis, resolve_config, split_config_overrides

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
ENV = r"(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*"  # VAR=value prefixes: XLA_FLAGS=... lm train ...
LM_LINE = re.compile(rf"^{ENV}(?:lm|python3? -m lm)\s+(.*)$")
SCRIPT_LINE = re.compile(rf"^{ENV}\S*python3?\s+([\w./-]+\.py)(?:\s|$)")
FLAG_HELPERS = {"define_string_once": None, "define_workdir": "workdir"}  # lm/cli's helpers: None = first argument
ABSL_FLAGS = ("help", "helpshort", "helpfull", "flagfile")


def code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, shell line) of every fenced code block of a markdown text, backslash continuations
    joined into their first line."""
    lines, fence, pending = [], False, None
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if not fence:
            continue
        joined = (pending[1] + " " + line.strip()) if pending else line.strip()
        start = pending[0] if pending else number
        if joined.endswith("\\"):
            pending = (start, joined[:-1].rstrip())
            continue
        pending = None
        lines.append((start, joined))
    return lines


def doc_commands() -> list[tuple[str, list[str]]]:
    """('<doc>:<line>', argv after `lm`) of every lm command line in the docs, quotes and comments
    resolved as the shell does, the [ ] of optional arguments dropped."""
    commands = []
    for doc in DOCS:
        for number, line in code_lines(doc.read_text()):
            match = LM_LINE.match(line)
            if not match:
                continue
            argv = [word.strip("[]") for word in shlex.split(match.group(1), comments=True)]
            commands.append((f"{doc.relative_to(REPO)}:{number}", [word for word in argv if word]))
    return commands


def doc_scripts() -> list[tuple[str, str]]:
    """('<doc>:<line>', path) of every `python path.py ...` line of the docs' code blocks."""
    return [(f"{doc.relative_to(REPO)}:{number}", match.group(1)) for doc in DOCS
            for number, line in code_lines(doc.read_text()) if (match := SCRIPT_LINE.match(line))]


def defined_flags(command: str) -> set[str]:
    """The flags lm/cli/<command>.py defines (flags.DEFINE_*(name, ...) and lm.cli's define_* helpers),
    read from its source: the flags a command shares with another (--workdir) are registered only by
    the first module a process imports, so the process's own registry cannot tell them apart."""
    names = set()
    for node in ast.walk(ast.parse((REPO / "lm" / "cli" / f"{command}.py").read_text())):
        if not isinstance(node, ast.Call):
            continue
        function = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if function.startswith("DEFINE_") or function in FLAG_HELPERS:
            names.add(FLAG_HELPERS.get(function) or ast.literal_eval(node.args[0]))
        else:
            assert not function.startswith("define_"), f"lm/cli/{command}.py: add {function} to FLAG_HELPERS"
    return names


COMMANDS = doc_commands()


def test_the_docs_hold_the_commands_this_test_checks():
    """The reader finds the docs' commands (continued lines joined, VAR=value prefixes, optional [--flag]s),
    and its flag reader agrees with absl's registry on what each command module defines itself."""
    assert len(COMMANDS) >= 40, len(COMMANDS)
    where = {tuple(argv[:2]): place for place, argv in COMMANDS}
    assert where[("train", "--config=configs/gpt_shakespeare.py:small")].startswith("docs/launching.md")
    assert ["sweep", "--config=configs/gpt_shakespeare.py:baby", "--sweep=model.norm_position=pre,post",
            "--sweep=seed=0,1,2", "--workdir=runs/norm", "--parallel=2", "--config.train.num_steps=500"] in [
        argv for _, argv in COMMANDS]
    assert code_lines("```bash\nA=1 lm train \\\n    --x=1  # c\n```\nlm eval\n") == [(2, "A=1 lm train --x=1  # c")]
    for command in cli.COMMANDS:
        module = importlib.import_module(f"lm.cli.{command}")
        registered = {flag.name for flag in flags.FLAGS.flags_by_module_dict().get(module.__name__, [])}
        assert registered <= defined_flags(command), (command, registered - defined_flags(command))
    assert {"config", "workdir", "dry_run", "print_config"} <= defined_flags("train")


@pytest.mark.parametrize("place, argv", COMMANDS, ids=[place for place, _ in COMMANDS])
def test_a_documented_command_exists_and_takes_its_flags(place, argv):
    command, *args = argv
    assert command in cli.COMMANDS, f"{place}: lm {command} is no command (lm --help lists them)"
    config_overrides = command in ("train", "sweep")
    args, _ = split_config_overrides(args) if config_overrides else (args, {})
    known = defined_flags(command)
    unknown = [arg for arg in args if arg.startswith("--")
               and arg[2:].partition("=")[0] not in known | set(ABSL_FLAGS)]
    assert not unknown, f"{place}: lm {command} has no flag {', '.join(unknown)} (it has {', '.join(sorted(known))})"


def flag_values(args: list[str], name: str) -> list[str]:
    return [arg.partition("=")[2] for arg in args if arg.startswith(f"--{name}=")]


TRAINING = [(place, argv) for place, argv in COMMANDS if argv[0] in ("train", "sweep")]


@pytest.mark.parametrize("place, argv", TRAINING, ids=[place for place, _ in TRAINING])
def test_a_documented_config_loads_with_its_overrides(place, argv, monkeypatch, tmp_path):
    """lm train: the config and its overrides resolve; lm sweep: every arm's does (plan_sweep)."""
    monkeypatch.chdir(REPO)  # the docs' paths are relative to the repository
    command, *args = argv
    args, overrides = split_config_overrides(args)
    if command == "train":
        (spec,) = flag_values(args, "config")
        resolve_config(spec, overrides)
        return
    (sweep_file,) = flag_values(args, "sweep_file") or [None]
    if sweep_file:
        spec, axes, file_overrides = sweep.load_sweep_file(sweep_file)
        overrides = {**file_overrides, **overrides}
    else:
        (spec,) = flag_values(args, "config")
        axes = dict(parse_axis(text) for text in flag_values(args, "sweep"))
    assert sweep.plan_sweep(spec, axes, overrides, tmp_path), place


def test_documented_scripts_and_extras_exist():
    scripts = doc_scripts()
    assert ("docs/ablations.md", "benchmarks/step_time.py") in [(p.split(":")[0], s) for p, s in scripts]
    missing = [f"{place}: {path}" for place, path in scripts if not (REPO / path).is_file()]
    assert not missing, missing
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = {(doc.relative_to(REPO), extra) for doc in DOCS
             for group in re.findall(r'pip install -e "\.\[([\w,-]+)\]"', doc.read_text())
             for extra in group.split(",")}
    assert {extra for _, extra in named} >= {"dev", "gpu", "tensorboard"}
    unknown = [f"{doc}: .[{extra}]" for doc, extra in named if extra not in extras]
    assert not unknown, f"{unknown}: pyproject.toml defines {sorted(extras)}"


README_MAX_LINES = 150
INTERNAL_NOTES = re.compile(r"\bissues? #?\d+|\b(?:this|another|other) sessions?\b|\bour (?:VM|machine|CPU)s?\b"
                            r"|\bshared/(?:data|peers)\b", re.IGNORECASE)


def test_the_readme_is_a_front_page():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move detail into docs/"
    assert "python -m pytest tests -n auto --runslow" in "\n".join(lines)


def test_the_docs_speak_to_users():
    """No notes of how lm was made: issue numbers, sessions, our machines, paths the repository does not ship."""
    assert INTERNAL_NOTES.search("as issue 30 saw, beside another session's tests on our VM")
    notes = [f"{doc.relative_to(REPO)}:{number}: {match.group(0)}" for doc in DOCS
             for number, line in enumerate(doc.read_text().splitlines(), 1) if (match := INTERNAL_NOTES.search(line))]
    assert not notes, notes


def test_the_documentation_site_builds_strictly(tmp_path):
    """mkdocs.yml's site: every page in the nav, every link and anchor between pages found, the repository
    files they link to present, the reference generated from the code (docs/hooks.py) without a warning."""
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                           cwd=REPO, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, built.stderr[-4000:]
    site = tmp_path / "site"
    assert "--print_config" in (site / "reference" / "commands" / "index.html").read_text()
    assert "model.norm_position" in (site / "reference" / "configs" / "gpt_shakespeare" / "index.html").read_text()
    assert "train_data" in (site / "reference" / "experiment" / "index.html").read_text()


def test_the_site_carries_the_repository_files_its_pages_link_to():
    """docs/hooks.py: a page's link out of docs/ names the repository file (a folder: its README.md), copied
    under repo/; links in code blocks, URLs and anchors alone are left alone."""
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    assert hooks.resolve("docs/ablations.md", "../launch/tpu_vm.sh#top") == ("launch/tpu_vm.sh", "#top")
    assert hooks.resolve("docs/ablations.md", "data.md") == ("docs/data.md", "")
    assert hooks.resolve("docs/ablations.md", "../experiments/studies/") == ("experiments/studies/README.md", "")
    assert hooks.resolve("experiments/studies/README.md", "../../docs/ablations.md")[0] == "docs/ablations.md"
    for target in ("https://example.org/a.md", "#anchor", "/abs.md", "../../outside.md"):
        assert hooks.resolve("docs/ablations.md", target)[0] is None, target
    text = "[a](../launch/slurm.sbatch) ![b](data.md)\n```bash\n[c](../launch/multinode.sh)\n```\n"
    assert hooks.linked_paths("docs/launching.md", text) == {"launch/slurm.sbatch"}
    assert hooks.repository_path("repo/launch/README.md") == "launch/README.md"
    assert hooks.repository_path("reference/commands.md") == "docs/reference/commands.md"
