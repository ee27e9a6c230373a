"""The package layout: no import circles, the core below the assistant, one class per name, no UI library in
the logic packages, and light commands that start without torch.

The import graph is read from the source (ast), every import counted wherever it sits (module level, inside a
function, under TYPE_CHECKING): a circle hidden in a function is still two modules that cannot be understood
apart. A planted bad tree shows each check can fail.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kronos_core", "kronos_tune")
CORE_FORBIDDEN = {"kronos_tune", "rich", "textual", "typer", "click", "textual_plotext"}
UI_LIBRARIES = {"rich", "textual", "textual_plotext"}
UI_LAYERS = ("kronos_tune.commands", "kronos_tune.tui", "kronos_tune.cli")  # where the terminal is drawn


def module_files(root: Path) -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def imported_names(module: str, path: Path) -> set[str]:
    """Every dotted name `module` imports, relative imports resolved; `from a import b` yields a and a.b."""
    names: set[str] = set()
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package[: len(package) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the project modules it imports (a package's own __init__ above it is not an edge)."""
    files = module_files(root)

    def owner(name: str) -> str | None:
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            candidate = ".".join(parts[:end])
            if candidate in files:
                return candidate
        return None

    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        targets = {owner(name) for name in imported_names(module, path)}
        graph[module] = {t for t in targets if t and t != module and not module.startswith(t + ".")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def package_of(module: str) -> str:
    """A module's package for the package-level graph: its top-level package's subpackage or module
    (kronos_tune.memory.meters -> kronos_tune.memory, kronos_core.launch -> kronos_core.launch)."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = defaultdict(set)
    for module, targets in graph.items():
        packages[package_of(module)].update(package_of(t) for t in targets if package_of(t) != package_of(module))
    return dict(packages)


def core_violations(root: Path) -> list[str]:
    bad = []
    for module, path in module_files(root).items():
        if module.split(".")[0] != "kronos_core":
            continue
        for name in imported_names(module, path):
            if name.split(".")[0] in CORE_FORBIDDEN:
                bad.append(f"{module} imports {name}")
    return sorted(set(bad))


def ui_in_logic(root: Path) -> list[str]:
    """kronos_tune modules outside the command line and the dashboard that import a UI library."""
    bad = []
    for module, path in module_files(root).items():
        if module.split(".")[0] != "kronos_tune" or module.startswith(UI_LAYERS):
            continue
        bad += [f"{module} imports {name}" for name in imported_names(module, path) if name.split(".")[0] in UI_LIBRARIES]
    return sorted(set(bad))


def classes_defined_twice(root: Path) -> dict[str, list[str]]:
    where: dict[str, list[str]] = defaultdict(list)
    for module, path in module_files(root).items():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                where[node.name].append(module)
    return {name: modules for name, modules in where.items() if len(modules) > 1}


def test_no_import_circles() -> None:
    assert circles(import_graph(ROOT)) == []


def test_no_package_level_import_circles() -> None:
    """Two packages (or a package and a top-level module) that import each other, through any modules, are one
    concern split in two: the shared part moves down or they merge."""
    assert circles(package_graph(import_graph(ROOT))) == []


def test_core_imports_no_assistant_or_ui() -> None:
    assert core_violations(ROOT) == []


def test_no_class_name_defined_twice() -> None:
    assert classes_defined_twice(ROOT) == {}


def test_logic_packages_import_no_ui_library() -> None:
    assert ui_in_logic(ROOT) == []


TEST_KNOB_PREFIXES = ("KRONOS_TUNE_FAULT", "KRONOS_TUNE_PLANT", "KRONOS_TUNE_TEST_", "KRONOS_TEST_", "KRONOS_BENCH_")


def test_knobs(root: Path) -> list[str]:
    """Product modules (kronos_core, kronos_tune) that name a test or benchmark knob: those are read only by the
    entry points in benchmarks/ (planted_trials, planted_ranks)."""
    found = []
    for path in sorted([*(root / "kronos_core").rglob("*.py"), *(root / "kronos_tune").rglob("*.py")]):
        text = path.read_text(encoding="utf-8")
        found += [f"{path.relative_to(root)} names {knob}" for knob in TEST_KNOB_PREFIXES if knob in text]
    return found


test_knobs.__test__ = False  # a helper, not a test


def test_product_code_reads_no_test_knob() -> None:
    assert test_knobs(ROOT) == []


OUTSIDE = ("tests", "benchmarks", "scripts")  # what wraps or monkeypatches the product from outside
# Names a framework calls by itself (Textual's handlers and render methods), never written at a call site.
CALLED_BY_FRAMEWORK = re.compile(r"^(on_|action_|watch_|validate_|compute_|compose$|render|get_content_)")
PLAIN_DECORATORS = {"property", "cached_property", "staticmethod", "classmethod"}


def product_files(root: Path) -> list[Path]:
    return sorted([*(root / "kronos_core").rglob("*.py"), *(root / "kronos_tune").rglob("*.py")])


def hooks_classes(root: Path) -> list[str]:
    """Classes named *Hooks in the product: code a test or benchmark plants inside it belongs outside."""
    return [f"{path.relative_to(root)}: {node.name}" for path in product_files(root)
            for node in ast.parse(path.read_text(encoding="utf-8")).body
            if isinstance(node, ast.ClassDef) and node.name.endswith("Hooks")]


def _switch_globals(root: Path) -> dict[str, str]:
    """Module globals of the product that a caller could swap: None placeholders and module names to start."""
    found = {}
    for path in product_files(root):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
                node.target if isinstance(node, ast.AnnAssign) else None
            value = getattr(node, "value", None)
            if isinstance(target, ast.Name) and isinstance(value, ast.Constant) and (
                    value.value is None or str(value.value).startswith(("kronos_core.", "kronos_tune."))):
                found[target.id] = f"{path.relative_to(root)}"
    return found


def test_switches(root: Path) -> list[str]:
    """Module-global test switches: a product global left None for outside code to fill, and any such global
    (or a module name the product starts) that tests, benchmarks or scripts reassign."""
    switches = _switch_globals(root)
    bad = []
    for path in product_files(root):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            target = node.target if isinstance(node, ast.AnnAssign) else None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
            if isinstance(target, ast.Name) and isinstance(getattr(node, "value", None), ast.Constant) \
                    and node.value.value is None:
                bad.append(f"{path.relative_to(root)}: {target.id} = None")
    for folder in OUTSIDE:
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                name = None
                if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "setattr" and \
                        len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
                    name = node.args[1].value
                elif isinstance(node, ast.Assign):
                    name = next((t.attr for t in node.targets if isinstance(t, ast.Attribute)), None)
                if name in switches:
                    bad.append(f"{path.relative_to(root)} reassigns {name} ({switches[name]})")
    return sorted(bad)


test_switches.__test__ = False  # a helper, not a test


def functions_only_tests_call(root: Path) -> list[str]:
    """Public functions and methods of the product whose name appears nowhere in the product, benchmarks/ or
    scripts/ but at their own definition (a word count over the text, so a mention in a docstring counts)."""
    words: dict[str, int] = defaultdict(int)
    for folder in ("kronos_core", "kronos_tune", "benchmarks", "scripts"):
        for path in (root / folder).rglob("*.py"):
            for word in re.findall(r"[A-Za-z_]\w*", path.read_text(encoding="utf-8")):
                words[word] += 1
    found = []
    for path in product_files(root):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        functions = [node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
        functions += [node for cls in tree.body if isinstance(cls, ast.ClassDef) for node in cls.body
                      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for node in functions:
            decorators = {getattr(d, "id", getattr(d, "attr", "")) for d in node.decorator_list}
            if node.name.startswith("_") or CALLED_BY_FRAMEWORK.match(node.name) or decorators - PLAIN_DECORATORS:
                continue
            if words[node.name] <= 1:
                found.append(f"{path.relative_to(root)}: {node.name}")
    return found


def test_no_hooks_test_switches_or_functions_only_tests_call() -> None:
    """Tests and benchmarks wrap or monkeypatch the product's own entry points from outside (a trial worker's
    session, `predict_chunk`, an actor class): the product carries no hook, switch or helper for them."""
    assert hooks_classes(ROOT) == []
    assert test_switches(ROOT) == []
    assert functions_only_tests_call(ROOT) == []


@pytest.fixture()
def bad_tree(tmp_path: Path) -> Path:
    core, tune = tmp_path / "kronos_core", tmp_path / "kronos_tune"
    (core / "predict").mkdir(parents=True)
    tune.mkdir()
    (core / "__init__.py").write_text("")
    (core / "predict" / "__init__.py").write_text("")
    (core / "predict" / "a.py").write_text("from . import b\n\nclass Twice:\n    pass\n")
    (core / "predict" / "b.py").write_text("def f():\n    from kronos_core.predict.a import Twice\n")
    (core / "ui.py").write_text("import rich\nfrom kronos_tune.x import y\n")
    (tune / "__init__.py").write_text("")
    (tune / "x.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kronos_tune.z import C\n"
                               "class Twice:\n    pass\ny = 1\n")
    (tune / "z.py").write_text("from kronos_tune.x import y\nclass C:\n    pass\n")
    (tune / "logic.py").write_text("def draw():\n    from rich.text import Text\n")
    (tune / "commands").mkdir()
    (tune / "commands" / "__init__.py").write_text("")
    (tune / "commands" / "view.py").write_text("import rich\n")
    (tune / "worker.py").write_text("import os\nDELAY = os.environ.get('KRONOS_TUNE_PLANT')\nWORKER = 'kronos_tune.x'\n"
                                    "HOOKS = None\n\nclass WorkerHooks:\n    def used(self):\n        return DELAY\n\n"
                                    "def only_tests_call():\n    return WorkerHooks().used()\n")
    for package, other in (("p", "q"), ("q", "p")):  # a package-level circle through modules in no circle
        (tune / package).mkdir()
        (tune / package / "__init__.py").write_text("")
        (tune / package / "low.py").write_text("X = 1\n")
        (tune / package / "high.py").write_text(f"from kronos_tune.{other}.low import X\n")
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "entry.py").write_text("from kronos_tune import worker\nworker.WORKER = 'benchmarks.entry'\n")
    return tmp_path


def test_the_checks_fail_on_a_planted_bad_tree(bad_tree: Path) -> None:
    assert sorted(circles(import_graph(bad_tree))) == [["kronos_core.predict.a", "kronos_core.predict.b"],
                                                        ["kronos_tune.x", "kronos_tune.z"]]
    assert core_violations(bad_tree) == ["kronos_core.ui imports kronos_tune.x", "kronos_core.ui imports kronos_tune.x.y",
                                         "kronos_core.ui imports rich"]
    assert classes_defined_twice(bad_tree) == {"Twice": ["kronos_core.predict.a", "kronos_tune.x"]}
    assert ui_in_logic(bad_tree) == ["kronos_tune.logic imports rich.text", "kronos_tune.logic imports rich.text.Text"]
    assert test_knobs(bad_tree) == ["kronos_tune/worker.py names KRONOS_TUNE_PLANT"]
    assert sorted(circles(package_graph(import_graph(bad_tree)))) == [["kronos_tune.p", "kronos_tune.q"],
                                                                     ["kronos_tune.x", "kronos_tune.z"]]
    assert hooks_classes(bad_tree) == ["kronos_tune/worker.py: WorkerHooks"]
    assert test_switches(bad_tree) == ["benchmarks/entry.py reassigns WORKER (kronos_tune/worker.py)",
                                       "kronos_tune/worker.py: HOOKS = None"]
    assert functions_only_tests_call(bad_tree) == ["kronos_core/predict/b.py: f", "kronos_tune/logic.py: draw",
                                                   "kronos_tune/worker.py: only_tests_call"]


# Light commands ------------------------------------------------------------------------------------------

def torch_after(argvs: list[list[str]], cwd: Path) -> list[tuple[list[str], int, bool]]:
    """Run `kronos-tune ARGV` for each ARGV, in order, in one fresh interpreter: each one's exit code and whether
    torch was imported by then (once one imports it, the later ones say so too)."""
    script = ("import json, sys\nfrom kronos_tune.cli import main\nseen = []\n"
              "for argv in json.loads(sys.argv[1]):\n    code = 0\n    try:\n        main(argv)\n"
              "    except SystemExit as exit_:\n        code = exit_.code or 0\n"
              "    seen.append([argv, code, 'torch' in sys.modules])\n"
              "print(json.dumps(seen))\n")
    done = subprocess.run([sys.executable, "-c", script, json.dumps(argvs)], cwd=cwd, capture_output=True, text=True,
                          timeout=300)
    return [tuple(item) for item in json.loads(done.stdout.strip().splitlines()[-1])]


def every_command_path() -> list[list[str]]:
    """Every command and subcommand of `kronos-tune`, as the words that run it (["config", "keys"], ...)."""
    import typer

    from kronos_tune.cli import build_app

    def walk(command: Any, path: list[str]) -> list[list[str]]:
        found = []
        for name, sub in getattr(command, "commands", {}).items():
            found += [path + [name]] + walk(sub, path + [name])
        return found

    return walk(typer.main.get_command(build_app()), [])


# One-line errors that need no model: checked before anything loads torch.
BAD_FLAGS = (["benchmark", "--preset", "cpu", "--task", "nope"],
             ["benchmark", "--preset", "cpu", "--skip", "nope"],
             ["benchmark", "--preset", "cpu", "--task", "predict", "--min-spearman", "2"],
             ["train", "--what", "nope"],
             ["train", "--resume", "no-such-run"],
             ["autobatch", "--preset", "cpu", "--margin", "2"],
             ["autobatch", "--preset", "nope"],
             ["autobatch", "--preset", "cpu", "--lr-rule", "nope"],
             ["plan", "--preset", "nope"],
             ["profile", "--preset", "nope"],
             ["train", "--preset", "cpu", "--data", "no-such.csv"],
             ["predict", "--size", "mini", "--lookback", "64"],
             ["predict", "--size", "mini", "--lookback", "64", "--pred-len", "4", "--data", "no-such.csv"],
             ["predict", "--size", "mini", "--synthetic", "2", "--lookback", "64", "--pred-len", "4", "--top-p", "3"],
             ["backtest", "--size", "mini", "--lookback", "64", "--pred-len", "4", "--data", "no-such.csv"])


def test_help_bad_flags_and_report_start_without_torch(tmp_path: Path) -> None:
    from test_report_cli import write_gpu_run

    from kronos_tune.cli import main

    run = write_gpu_run(tmp_path / "run", preset="cpu")
    copied = write_gpu_run(tmp_path / "copied", preset="cpu")  # results.jsonl and run.json only, never reported
    with pytest.raises(SystemExit) as done:  # the first rebuild writes report.json (its FLOPs per token counted)
        main(["report", str(run)])
    assert done.value.code == 0 and json.loads((run / "report.json").read_text())["flops"]["flops_per_token"] > 0
    written = {name: (run / name).read_bytes() for name in ("report.json", "report.md", "report.csv")}
    commands = every_command_path()
    assert {"train", "autobatch", "benchmark", "report"} <= {path[0] for path in commands} and ["config", "keys"] in commands
    helps = [["--help"]] + [path + ["--help"] for path in commands]
    argvs = helps + [list(a) for a in BAD_FLAGS] + [["report", str(run)], ["report", str(copied)]]
    expected = [(argv, 0 if argv in helps or argv[0] == "report" else 2, False) for argv in argvs]
    assert torch_after(argvs, tmp_path) == expected
    assert {name: (run / name).read_bytes() for name in written} == written  # the same files, without torch
    # The copied run's first report, written in the torch-free interpreter, holds the same FLOPs section.
    assert (json.loads((copied / "report.json").read_text())["flops"]
            == json.loads(written["report.json"])["flops"])
    assert not (tmp_path / "runs").exists()  # no run folder for a run refused up front

