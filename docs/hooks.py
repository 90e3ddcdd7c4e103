"""mkdocs hooks (mkdocs.yml `hooks:`): the reference pages generated from the code as the site builds, and
the repository files that the pages link to carried into the site.

Generated, never committed, so they cannot fall behind the code:
  reference/commands.md         every `lm` command: its usage (the module docstring) and the flags it defines,
                                read from a fresh process per command, as `lm <command> --help` shows them
  reference/configs/index.md    the config files, their experiments and default variants
  reference/configs/<name>.md   every key of configs/<name>.py's default variant: type, value, allowed values
                                or range, description (what `lm train --print_config` lists; lm/layers/options.py)

The pages link to files outside docs/ as the repository lays them out (`../experiments/...`), so that the
links work where the files are read on their own. Such a target is copied into the site under repo/ (a
markdown file becomes a page there, and what it links to comes too) and the link is rewritten to the copy;
a target that does not exist is left as written, and mkdocs reports it like any broken link. README.md is
copied too, so that its links and anchors into docs/ are checked with the site's.
"""

import concurrent.futures
import inspect
import json
import os
import pathlib
import posixpath
import re
import subprocess
import sys

from mkdocs.structure.files import File, Files, InclusionLevel

REPO = pathlib.Path(__file__).resolve().parents[1]
CARRIED = "repo/"  # where the site keeps the repository files its pages link to
LINK = re.compile(r"(\]\()([^)\s]+)(\))")  # a markdown link or image: [text](target) / ![alt](target)
FENCE = re.compile(r"^\s*(```|~~~)")

FLAGS_SCRIPT = """
import importlib, json, sys
from absl import flags
module = importlib.import_module("lm.cli." + sys.argv[1])
rows = [dict(name=f.name, type=f.flag_type(), default=f.default, help=f.help,
             choices=list(getattr(f.parser, "enum_values", None) or []))
        for f in flags.FLAGS.flags_by_module_dict().get(module.__name__, [])]
print(json.dumps(dict(doc=module.__doc__, flags=rows)))
"""


def on_config(config):
    """The configs import `configs` and `lm` from the repository."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return config


def on_files(files: Files, config) -> Files:
    for uri, content in generated_pages().items():
        files.append(File.generated(config, uri, content=content))
    carry_linked_files(files, config)
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Links to repository files outside docs/ point at their copies under repo/ (and the copies' links
    into docs/ at the pages)."""
    source = repository_path(page.file.src_uri)

    def rewrite(match: re.Match) -> str:
        target = match.group(2)
        resolved, anchor = resolve(source, target)
        if resolved is None or resolved.startswith("docs/") and not page.file.src_uri.startswith(CARRIED):
            return match.group(0)
        if (REPO / resolved).is_dir():
            return match.group(0)  # a folder without README.md: mkdocs reports the link (unrecognized_links)
        site = resolved.removeprefix("docs/") if resolved.startswith("docs/") else CARRIED + resolved
        link = posixpath.relpath(site, posixpath.dirname(page.file.src_uri) or ".")
        return f"{match.group(1)}{link}{anchor}{match.group(3)}"

    return outside_code(markdown, lambda text: LINK.sub(rewrite, text))


# --- repository files the pages link to ---------------------------------------------------------------


def repository_path(src_uri: str) -> str:
    """The repository path of a site page: docs/<uri>, or what a carried file copies."""
    return src_uri.removeprefix(CARRIED) if src_uri.startswith(CARRIED) else f"docs/{src_uri}"


def resolve(source: str, target: str) -> tuple[str | None, str]:
    """(the repository path a relative link of the file at source names, its #anchor): a folder's README.md
    or index.md where it has one; None for a link that is not a relative path inside the repository (a URL,
    an anchor alone, an absolute path)."""
    path, _, anchor = target.partition("#")
    if not path or re.match(r"^[a-z][a-z0-9+.-]*:", path) or path.startswith("/"):
        return None, ""
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
    if resolved.startswith(".."):
        return None, ""
    index = next((name for name in ("README.md", "index.md") if (REPO / resolved / name).is_file()), None)
    if (REPO / resolved).is_dir() and index:
        resolved = f"{resolved}/{index}"  # a folder's page
    return resolved, f"#{anchor}" if anchor else ""


def outside_code(markdown: str, change) -> str:
    """markdown with change(text) applied to the text outside its fenced code blocks."""
    parts, chunk, fenced = [], [], False
    for line in markdown.splitlines(keepends=True):
        if FENCE.match(line):
            parts.append(("".join(chunk), fenced))
            chunk, fenced = [], not fenced
            parts.append((line, True))
            continue
        chunk.append(line)
    parts.append(("".join(chunk), fenced))
    return "".join(text if fenced else change(text) for text, fenced in parts)


def linked_paths(source: str, markdown: str) -> set[str]:
    """The repository paths outside docs/ that the markdown of the file at source links to."""
    found = set()

    def collect(text: str) -> str:
        found.update(resolve(source, match.group(2))[0] for match in LINK.finditer(text))
        return text

    outside_code(markdown, collect)
    return {path for path in found if path and not path.startswith("docs/")}


def carry_linked_files(files: Files, config) -> None:
    """Copies into the site, under repo/, README.md (so that its links and anchors are checked too) and every
    existing repository file outside docs/ that a page links to, and then what the copied markdown files
    link to."""
    queue = [(repository_path(f.src_uri), f.content_string) for f in files.documentation_pages()]
    carried = set()
    paths = {"README.md"}
    while paths or queue:
        for path in sorted(paths - carried):
            file = REPO / path
            if not file.is_file():
                continue  # mkdocs reports the link
            carried.add(path)
            files.append(File.generated(config, CARRIED + path, abs_src_path=str(file),
                                        inclusion=InclusionLevel.NOT_IN_NAV))
            if file.suffix == ".md":
                queue.append((path, file.read_text()))
        paths = linked_paths(*queue.pop()) if queue else set()


# --- the generated reference ----------------------------------------------------------------------------


def generated_pages() -> dict[str, str]:
    pages = {"reference/commands.md": commands_page()}
    configs = config_files()
    pages["reference/configs/index.md"] = configs_index(configs)
    for name, (config, module) in configs.items():
        pages[f"reference/configs/{name}.md"] = config_page(name, config, module)
    return pages


def markdown_cell(text: str) -> str:
    """text in a table cell, shown as written: markdown's marks escaped outside `code`, pipes escaped."""
    pieces = str(text).replace("\n", " ").split("`")
    for i in range(0, len(pieces), 2):
        pieces[i] = re.sub(r"([\\*_\[\]<>])", r"\\\1", pieces[i])
    return "`".join(pieces).replace("|", "\\|")


def code_cell(value: str) -> str:
    return f"`{value}`".replace("|", "\\|") if value != "" else ""


def command_flags(command: str) -> dict:
    """The docstring and the flags (name, type, default, help, choices) of lm/cli/<command>.py, from a
    process that imports that command alone (flags that several commands define, such as --workdir,
    carry the help of the first module a process imports)."""
    out = subprocess.run([sys.executable, "-c", FLAGS_SCRIPT, command], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"}, check=True)
    return json.loads(out.stdout)


def commands_page() -> str:
    from lm import cli

    with concurrent.futures.ThreadPoolExecutor() as pool:
        found = dict(zip(cli.COMMANDS, pool.map(command_flags, cli.COMMANDS), strict=True))
    lines = ["# Commands", "",
             "`lm <command> [flags]` (or `python -m lm <command> [flags]`); `lm --help` lists the commands, "
             "`lm <command> --help` prints what this page shows of one. A mistake in a flag is one line, "
             "`error: ...`, exit code 2. This page is generated from the commands' code as the site builds.", "",
             "| command | what it does |", "|---|---|"]
    lines += [f"| [`lm {name}`](#lm-{name}) | {markdown_cell(cli.summary(name))} |" for name in cli.COMMANDS]
    for name, found_flags in found.items():
        lines += ["", f"## lm {name}", "", "```text", found_flags["doc"].strip(), "```", "",
                  "| flag | type | default | description |", "|---|---|---|---|"]
        for flag in sorted(found_flags["flags"], key=lambda flag: flag["name"]):
            kind = flag["type"] + (f": {', '.join(flag['choices'])}" if flag["choices"] else "")
            lines.append(f"| `--{flag['name']}` | {markdown_cell(kind)} | {code_cell(flag_value(flag['default']))} | "
                         f"{markdown_cell(flag['help'])} |")
    return "\n".join(lines) + "\n"


def flag_value(value) -> str:
    """A flag's default as it is written on the command line ('' for none)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(map(str, value))
    return repr(value) if isinstance(value, str) and (not value.isprintable() or not value) else str(value)


def config_files() -> dict[str, tuple]:
    """name -> (the resolved config of its default variant, the loaded module) of every configs/<name>.py
    with a get_config."""
    from lm.cli.overrides import resolve_config

    found = {}
    for path in sorted((REPO / "configs").glob("*.py")):
        if "def get_config" not in path.read_text():
            continue
        config = resolve_config(str(path), {})
        found[path.stem] = (config, sys.modules[f"lm_config_{path.stem}"])
    return found


def default_variant(module) -> str | None:
    parameter = next(iter(inspect.signature(module.get_config).parameters.values()), None)
    return None if parameter is None or parameter.default is inspect.Parameter.empty else parameter.default


def configs_index(configs: dict[str, tuple]) -> str:
    lines = ["# Config keys", "",
             "A config is a Python file with `get_config(variant)`; its keys depend on its experiment (the "
             "`data` and `eval` sections above all), so each file has a page: every key of its default "
             "variant with its type, value, allowed values or range and description. "
             "`lm train --config=FILE:VARIANT --print_config [--config.KEY=VALUE ...]` prints the same for any "
             "variant and overrides ([Configs and overrides](../../configs.md)). These pages are generated from "
             "the options each section declares, as the site builds.", "",
             "| config | experiment | default variant | keys | what it trains |", "|---|---|---|---|---|"]
    for name, (config, module) in configs.items():
        summary = " ".join((module.__doc__ or "").strip().split("\n\n")[0].split())
        lines.append(f"| [`configs/{name}.py`]({name}.md) | `{config.experiment}` | `{default_variant(module)}` | "
                     f"{len(leaves(config))} | {markdown_cell(summary)} |")
    return "\n".join(lines) + "\n"


def leaves(config, prefix: str = "") -> list[tuple]:
    """(dotted key, value, section, name in it) of every key of config with a value, in sorted order."""
    import ml_collections

    found = []
    for name, value in sorted(config.items()):
        if isinstance(value, ml_collections.ConfigDict):
            found += leaves(value, f"{prefix}{name}.")
        else:
            found.append((prefix + name, value, config, name))
    return found


def config_page(name: str, config, module) -> str:
    from lm.layers.options import description

    variant = default_variant(module)
    lines = [f"# configs/{name}.py", "", "```text", (module.__doc__ or "").strip(), "```", "",
             f"The keys of `--config=configs/{name}.py` (the variant `{variant}`), generated from the code: each "
             "with its type, its value here (and the default its section declares, where this config sets "
             f"another), its allowed values or range and its description. `lm train --config=configs/{name}.py:VARIANT "
             "--print_config` lists another variant's values."]
    sections: dict[str, list] = {}
    for key, value, section, key_name in leaves(config):
        sections.setdefault(key.split(".")[0] if "." in key else "", []).append((key, value, section, key_name))
    for title, rows in sorted(sections.items()):
        lines += ["", f"## {title or 'Top-level keys'}", "",
                  "| key | type | value | allowed | description |", "|---|---|---|---|---|"]
        for key, value, section, key_name in rows:
            declared = description(section, key_name)
            allowed = ""
            if declared and declared.choices:
                allowed = ", ".join(code_cell(str(choice)) for choice in declared.choices)
            elif declared and declared.bounds:
                allowed = markdown_cell(str(declared.bounds))
            text = markdown_cell(declared.doc) if declared else "no description"
            shown = code_cell(repr(value))
            default = getattr(declared, "default", value)  # the declared default, where the config sets another
            if default != value:
                shown += f" (default {code_cell(repr(default))})"
            lines.append(f"| `{key}` | {type(value).__name__} | {shown} | {allowed} | {text} |")
    return "\n".join(lines) + "\n"
