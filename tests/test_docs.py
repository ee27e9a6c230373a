"""The docs point at things that exist: module paths, dotted names, links, and the commands' flags.

Modules move; a page that names the old place misleads the next reader. These checks read README.md and
docs/*.md as text (no imports but the command line's own, to read each command's flags) and fail on a module
path or dotted name that is not in the tree, a link to a page or heading that is not there, a command line
with a command or flag the CLI does not have, and a README quick start that drifts from what CI runs.
A planted bad page shows each check failing.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = ("kronos_core", "kronos_tune", "benchmarks")  # importable: dotted names are checked against these
SOURCE_FOLDERS = (*TOP, "scripts", "tests", "presets", "docs", ".ci")


def pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def checked_text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


@dataclass(frozen=True)
class Tree:
    """What exists: the source files (relative paths) and each module's text, by dotted name."""

    files: frozenset[str]
    modules: dict[str, str]

    @classmethod
    def read(cls, root: Path) -> Tree:
        files = {path.name for path in root.iterdir() if path.is_file()}
        modules = {}
        for folder, subfolders, names in (entry for top in SOURCE_FOLDERS for entry in os.walk(root / top)):
            subfolders[:] = [d for d in subfolders if not d.startswith(".") and d != "__pycache__"]
            for name in names:
                relative = (Path(folder) / name).relative_to(root)
                files.add(relative.as_posix())
                if name.endswith(".py") and relative.parts[0] in TOP:
                    parts = list(relative.with_suffix("").parts)
                    if parts[-1] == "__init__":
                        parts = parts[:-1]
                    modules[".".join(parts)] = (root / relative).read_text(encoding="utf-8")
        return cls(frozenset(files), modules)

    def has_path(self, path: str) -> bool:
        """A path from the root, or one that some file's path ends with (`plan/planner.py`)."""
        path = path.rstrip("/")
        return path in self.files or any(f.endswith("/" + path) or f.startswith(path + "/") for f in self.files)

    def has_dotted(self, name: str) -> bool:
        """`pkg.module[.attribute]`: the longest module prefix exists and names the next part, if any."""
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            module = ".".join(parts[:end])
            if module in self.modules:
                rest = parts[end:]
                return not rest or re.search(rf"\b{re.escape(rest[0])}\b", self.modules[module]) is not None
        return False


PATH = re.compile(r"(?<![\w./-])((?:kronos_core|kronos_tune|benchmarks|scripts|tests|presets|docs)/[\w./-]*\w"
                  r"|[\w/]+/[\w]+\.py)\b")
DOTTED = re.compile(r"(?<![\w./-])((?:kronos_core|kronos_tune|benchmarks)(?:\.\w+)+)")


def stale_names(root: Path) -> list[str]:
    tree = Tree.read(root)
    stale = []
    for page in pages(root):
        text = checked_text(page)
        for path in sorted(set(PATH.findall(text))):
            if "<" not in path and not tree.has_path(path):
                stale.append(f"{page.name}: {path}")
        for name in sorted(set(DOTTED.findall(text))):
            if not tree.has_dotted(name):
                stale.append(f"{page.name}: {name}")
    return stale


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


LINK = re.compile(r"\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text without fenced blocks and code spans (a `](x.png)` in code is no link)."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S))


def broken_links(root: Path) -> list[str]:
    broken = []
    for page in pages(root):
        for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
            if re.match(r"[a-z]+://", target):
                continue
            file, _, anchor = target.partition("#")
            linked = (page.parent / file).resolve() if file else page
            if not linked.is_file():
                broken.append(f"{page.name}: {target}")
            elif anchor:
                headings = re.findall(r"^#+ (.+)$", linked.read_text(encoding="utf-8"), re.M)
                if anchor not in {slug(h) for h in headings}:
                    broken.append(f"{page.name}: {target} (no such heading)")
    return broken


def command_lines(text: str) -> list[str]:
    """Every `kronos-tune ...` line of the fenced shell blocks (continuations joined) and inline code spans."""
    found = []
    for block in re.findall(r"^```(?:bash|sh)\n(.*?)^```", text, re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("kronos-tune "):
                found.append(line)
    found += [span for span in re.findall(r"(?<!`)`(kronos-tune [^`]+)`", text)]
    return found


def unknown_flags(root: Path, flags_of) -> list[str]:
    """`flags_of(words)` -> the options the command named by the leading words takes, or None if no command."""
    unknown = []
    for page in pages(root):
        for line in command_lines(page.read_text(encoding="utf-8")):
            words = shlex.split(line.replace("[", " ").replace("]", " ").replace("\\|", "|"), posix=False)[1:]
            allowed = flags_of(words)
            if allowed is None:
                unknown.append(f"{page.name}: {line} (no such command)")
                continue
            for word in words:
                flag = word.split("=")[0]
                if re.fullmatch(r"--[a-z][a-z0-9-]*", flag) and flag not in allowed:
                    unknown.append(f"{page.name}: {line} ({flag})")
    return unknown


def cli_flags(words: list[str]) -> set[str] | None:
    """The options of `kronos-tune WORDS...`: the command's, and its subcommand's when one is named."""
    from kronos_tune.cli import COMMAND_MODULES

    if not words or words[0].startswith("--"):
        return {"--help", "--version"}  # `kronos-tune --help`: the root's own options
    if words[0] not in COMMAND_MODULES:
        return None
    return _options(words[0], words[1] if len(words) > 1 else "")


@functools.lru_cache(maxsize=None)
def _options(name: str, sub: str) -> frozenset[str]:
    import typer

    from kronos_tune.cli import build_app

    command = typer.main.get_command(build_app((name,)))
    command = getattr(command, "commands", {}).get(name, command)
    flags = {"--help"}
    for level in (command, getattr(command, "commands", {}).get(sub)):
        for param in getattr(level, "params", []):
            flags.update(opt for opt in [*param.opts, *param.secondary_opts] if opt.startswith("--"))
    return frozenset(flags)


def quick_start(readme: str) -> list[str]:
    """The commands of the README's first shell block."""
    block = re.search(r"^```bash\n(.*?)^```", readme, re.M | re.S)
    assert block, "README.md has no shell block"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


# ---- the real docs -------------------------------------------------------------------------------------------


def test_every_module_path_and_dotted_name_in_the_docs_exists() -> None:
    assert stale_names(ROOT) == []


def test_every_link_between_the_docs_reaches_a_page_and_heading() -> None:
    assert broken_links(ROOT) == []


def test_every_command_line_in_the_docs_uses_commands_and_flags_the_cli_has() -> None:
    assert unknown_flags(ROOT, cli_flags) == []


def test_the_readme_starts_with_two_commands_and_ci_runs_the_second() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    install_and_run, install_and_test = quick_start(readme)
    assert "pip install" in install_and_run and "kronos-tune benchmark" in install_and_run
    assert "pip install" in install_and_test and "python -m pytest" in install_and_test
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert install_and_test in ci
    assert readme.index(install_and_test) < readme.index("\n## ", readme.index("Quick start"))
    assert len(readme.splitlines()) < 250


# ---- planted bad pages -----------------------------------------------------------------------------------------


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    (tmp_path / "kronos_tune" / "benchmark").mkdir(parents=True)
    (tmp_path / "kronos_tune" / "__init__.py").write_text("")
    (tmp_path / "kronos_tune" / "benchmark" / "__init__.py").write_text("")
    (tmp_path / "kronos_tune" / "benchmark" / "kinds.py").write_text("def legacy_kind(): ...\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n\n## Reading the report\n")
    return tmp_path


def test_a_moved_module_or_a_missing_name_is_stale(planted: Path) -> None:
    (planted / "README.md").write_text(
        "`kronos_tune/benchmark/kinds.py` and `kronos_tune.benchmark.kinds.legacy_kind` exist;\n"
        "`kronos_tune/oldname/records.py`, `oldname/plan.py`, `kronos_tune.oldname.records` and\n"
        "`kronos_tune.benchmark.kinds.leave_out_memory_savers` do not.\n")
    assert stale_names(planted) == [
        "README.md: kronos_tune/oldname/records.py", "README.md: oldname/plan.py",
        "README.md: kronos_tune.benchmark.kinds.leave_out_memory_savers", "README.md: kronos_tune.oldname.records"]


def test_a_link_to_a_missing_page_or_heading_is_broken(planted: Path) -> None:
    (planted / "README.md").write_text(
        "[ok](docs/guide.md#reading-the-report) [gone](docs/skill.md) [typo](docs/guide.md#reading-a-report)"
        " [web](https://example.com/x.md) `![in code](nothing.png)`\n")
    assert broken_links(planted) == [
        "README.md: docs/skill.md", "README.md: docs/guide.md#reading-a-report (no such heading)"]


def test_a_command_or_flag_the_cli_lacks_is_named(planted: Path) -> None:
    (planted / "README.md").write_text(
        "```bash\nkronos-tune predict --size mini \\\n  --lookback 4 --pred-len 2   # two flags\n"
        "kronos-tune predict --sizes mini\nkronos-tune forecast --size mini\n```\n"
        "and `kronos-tune predict [--size small] [--json]` inline.\n")

    def flags_of(words: list[str]) -> set[str] | None:
        return {"--size", "--lookback", "--pred-len", "--json"} if words[0] == "predict" else None

    assert unknown_flags(planted, flags_of) == [
        "README.md: kronos-tune predict --sizes mini (--sizes)",
        "README.md: kronos-tune forecast --size mini (no such command)"]


def test_a_headings_anchor_is_githubs() -> None:
    assert slug("Settings from a file (`--config`)") == "settings-from-a-file---config"
    assert slug("Training up to a date (`--train-until`)") == "training-up-to-a-date---train-until"
