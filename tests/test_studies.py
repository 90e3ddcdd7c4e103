"""Every study folder of experiments/studies holds a README.md that states the question, the commands and the
result with a figure; its `lm sweep` commands name every sweep file of the folder, and each plans as lm sweep
plans it before anything trains (lm.cli.sweep.plan_sweep); the links and images of its README and reports
resolve; and the docs point to the folder. Nothing is trained."""

import re
import shlex

import pytest
from conftest import REPO

from lm.cli import sweep
from lm.cli.overrides import parse_axis, split_config_overrides

STUDIES = REPO / "experiments" / "studies"
FOLDERS = sorted(path for path in STUDIES.iterdir() if path.is_dir() and not path.name.startswith(("_", ".")))
PAGES = sorted(STUDIES.rglob("*.md"))  # the READMEs and the reports
SECTIONS = ("## Question", "## Commands", "## Result")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)


def shell_lines(text: str) -> list[str]:
    """The lines of a markdown text's fenced code blocks, backslash continuations joined."""
    lines, fence, pending = [], False, ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        elif fence:
            joined = f"{pending} {line.strip()}".strip()
            pending = joined[:-1].rstrip() if joined.endswith("\\") else ""
            if not pending:
                lines.append(joined)
    return lines


def sweep_commands(text: str) -> list[list[str]]:
    """The arguments after `lm sweep` of every such line in a markdown text's code blocks."""
    return [shlex.split(line, comments=True)[2:] for line in shell_lines(text) if line.startswith("lm sweep ")]


def slug(heading: str) -> str:
    """A heading's anchor as GitHub and mkdocs make it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path) -> set[str]:
    return {slug(line.lstrip("#")) for line in path.read_text().splitlines() if line.startswith("#")}


def flag(args: list[str], name: str) -> list[str]:
    return [arg.partition("=")[2] for arg in args if arg.startswith(f"--{name}=")]


def test_the_reader_finds_the_studies_and_their_commands():
    assert {"norm_position", "stability", "bert_sst2", "bert_sst2_curve"} <= {folder.name for folder in FOLDERS}
    text = "```bash\nlm sweep --sweep_file=a.py \\\n    --workdir=runs/a  # note\nlm compare runs/a\n```\nlm sweep x\n"
    assert sweep_commands(text) == [["--sweep_file=a.py", "--workdir=runs/a"]]
    assert slug("Stability: QK-norm, soft-capping and z-loss") == "stability-qk-norm-soft-capping-and-z-loss"


@pytest.mark.parametrize("folder", FOLDERS, ids=[folder.name for folder in FOLDERS])
def test_a_study_readme_states_the_question_the_commands_and_the_result(folder):
    text = (folder / "README.md").read_text()
    places = [text.find(f"\n{section}\n") for section in SECTIONS]
    assert -1 not in places and places == sorted(places), f"{folder.name}/README.md needs {', '.join(SECTIONS)}"
    commands = text[places[1]:places[2]]
    assert re.search(r"^(lm|python) ", "\n".join(shell_lines(commands)), re.M), f"{folder.name}: no command"
    figures = re.findall(r"!\[[^\]]*\]\(([^)\s]+\.png)\)", text[places[2]:])
    assert figures, f"{folder.name}/README.md shows no figure in its result"


@pytest.mark.parametrize("folder", FOLDERS, ids=[folder.name for folder in FOLDERS])
def test_a_study_readme_runs_every_sweep_file_of_its_folder(folder, monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)  # the commands' paths are relative to the repository
    commands = sweep_commands((folder / "README.md").read_text())
    named = {file for args in commands for file in flag(args, "sweep_file")}
    files = {str(path.relative_to(REPO)) for path in folder.glob("*.py")  # the sweep files: those with AXES, not
             if path.stem != "__init__" and "AXES" in path.read_text()}  # a script that draws a study's figure
    assert named == files, f"{folder.name}/README.md: sweep files not run {files - named}, not here {named - files}"
    for args in commands:
        args, overrides = split_config_overrides(args)
        assert flag(args, "workdir"), f"{folder.name}/README.md: lm sweep {' '.join(args)} has no --workdir"
        if flag(args, "sweep_file"):
            spec, axes, file_overrides = sweep.load_sweep_file(*flag(args, "sweep_file"))
        else:  # --config and --sweep axes
            spec, axes, file_overrides = *flag(args, "config"), dict(map(parse_axis, flag(args, "sweep"))), {}
        assert sweep.plan_sweep(spec, axes, {**file_overrides, **overrides}, tmp_path), args


@pytest.mark.parametrize("page", PAGES, ids=[str(path.relative_to(STUDIES)) for path in PAGES])
def test_a_study_pages_links_and_images_resolve(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists() or (anchor and resolved.suffix == ".md" and anchor not in anchors(resolved)):
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO)}: broken links {broken}"


def test_the_docs_and_the_index_point_to_every_study():
    docs = "".join(path.read_text() for path in sorted((REPO / "docs").glob("*.md")))
    index = (STUDIES / "README.md").read_text()
    assert not [folder.name for folder in FOLDERS if f"experiments/studies/{folder.name}/" not in docs]
    assert not [folder.name for folder in FOLDERS if f"]({folder.name}/)" not in index]
