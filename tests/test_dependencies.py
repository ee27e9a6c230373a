"""What a fresh environment needs is what pyproject.toml declares.

The suite runs in an environment that has every extra installed, so an import of a package that only arrives
transitively, or of an optional extra at a module's top level, passes here and fails for a user who ran the
README's install command. These checks read the imports themselves (ast) and the declared requirements.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import sys
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
OWN = {"kronos_core", "kronos_tune"}
CORE_ALLOWED = {"torch", "numpy", "pandas", "psutil", "safetensors", "tomli-w", "tomli", "pyarrow", "pyyaml",
                "huggingface-hub"}  # huggingface-hub: the [hub] extra, imported only to resolve a hub id
CORE_NOT_EXTRA = ("pyarrow", "scipy", "pyyaml")
UI_MODULES = {"kronos_tune", "rich", "textual", "typer", "click", "textual_plotext", "plotext"}


@dataclass(frozen=True)
class Import:
    file: Path
    line: int
    module: str  # top-level name
    at_import_time: bool  # runs when the module is imported (not in a function, try block or TYPE_CHECKING)


def _imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name.split(".")[0] for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module.split(".")[0]]
    return []


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(file: Path) -> list[Import]:
    """Every absolute import in `file`, marked by whether it runs when the module is imported."""
    found: list[Import] = []

    def visit(node: ast.AST, eager: bool) -> None:
        for name in _imported(node):
            found.append(Import(file, node.lineno, name, eager))
        for child in ast.iter_child_nodes(node):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Try)):
                visit(child, False)
            elif isinstance(node, ast.If) and _is_type_checking(node):
                visit(child, False)
            else:
                visit(child, eager)

    visit(ast.parse(file.read_text(encoding="utf-8")), True)
    return found


def third_party(imports: list[Import]) -> list[Import]:
    return [i for i in imports if i.module not in sys.stdlib_module_names and i.module not in OWN]


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s;<>=!~\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def declared(pyproject: Path) -> tuple[set[str], dict[str, set[str]]]:
    """The names of the required distributions, and of each extra's."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    required = {_requirement_name(r) for r in project["dependencies"]}
    extras = {extra: {_requirement_name(r) for r in reqs}
              for extra, reqs in project.get("optional-dependencies", {}).items()}
    return required, extras


@functools.lru_cache(maxsize=1)
def _installed() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def distributions_of(module: str) -> set[str]:
    """The distributions that install `module`; for one not installed here (e.g. tomli, needed only before
    Python 3.11), the distribution of the same name."""
    names = _installed().get(module) or [module]
    return {name.lower().replace("_", "-") for name in names}


def undeclared(files: list[Path], pyproject: Path) -> list[str]:
    """One line per third-party import that a fresh install of the declared requirements would not satisfy:
    not declared at all, or declared only as an extra but imported when the module loads."""
    required, extras = declared(pyproject)
    optional = set().union(*extras.values()) - {"pytest", "pytest-asyncio", "pytest-textual-snapshot",
                                                "pytest-xdist"}
    problems = []
    for item in (i for file in files for i in third_party(imports_of(file))):
        where = f"{item.file.relative_to(pyproject.parent)}:{item.line} imports {item.module}"
        dists = distributions_of(item.module)
        if dists & required:
            continue
        elif dists & optional:
            if item.at_import_time:
                problems.append(f"{where}: only an extra provides it, but it is imported when the module loads")
        else:
            problems.append(f"{where}: {', '.join(sorted(dists))} is not in pyproject.toml")
    return problems


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_every_third_party_import_is_declared_and_extras_load_lazily() -> None:
    assert undeclared(sources("kronos_core") + sources("kronos_tune"), ROOT / "pyproject.toml") == []


def test_kronos_core_imports_no_ui_and_only_its_own_dependencies() -> None:
    imports = [i for file in sources("kronos_core") for i in imports_of(file)]
    assert [f"{i.file.name}:{i.line} {i.module}" for i in imports if i.module in UI_MODULES] == []
    outside = {i.module for i in third_party(imports)
               if not distributions_of(i.module) & CORE_ALLOWED and i.module != "tomli"}
    assert outside == set()


def test_the_check_catches_an_undeclared_import_and_an_eager_extra(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\ndependencies = ["numpy>=1"]\n\n'
        '[project.optional-dependencies]\nplot = ["matplotlib>=3.7"]\n', encoding="utf-8")
    module = tmp_path / "mod.py"
    module.write_text(
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "import numpy\n"                 # declared
        "import pandas\n"                # installed here, not declared: reported
        "import matplotlib.pyplot\n"     # an extra at import time: reported
        "if TYPE_CHECKING:\n"
        "    import torch\n"             # for type checkers only: lazy, yet it must still be declared
        "try:\n"
        "    import matplotlib\n"        # guarded: fine
        "except ImportError:\n"
        "    pass\n"
        "def later():\n"
        "    import matplotlib\n",       # lazy: fine
        encoding="utf-8")
    problems = undeclared([module], tmp_path / "pyproject.toml")
    assert len(problems) == 3, problems
    assert problems[0].startswith("mod.py:4 imports pandas") and "not in pyproject.toml" in problems[0]
    assert problems[1].startswith("mod.py:5 imports matplotlib") and "imported when the module loads" in problems[1]
    assert problems[2].startswith("mod.py:7 imports torch") and "not in pyproject.toml" in problems[2]


def test_the_training_package_imports_pandas_only_when_a_table_is_read() -> None:
    import subprocess

    probe = ("import sys\nimport kronos_core.train, kronos_tune.plan.planner, kronos_tune.autobatch.train_probes\n"
             "print('pandas' in sys.modules)\n"
             "from kronos_core.data.synthetic import synthetic_series\n"
             "from kronos_core.data import kline\n"
             "frame = synthetic_series(1, 40)[0]\n"
             "print('pandas' in sys.modules, isinstance(frame, kline.pd.DataFrame), kline.pd.DataFrame.__module__)\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    before, after = result.stdout.strip().splitlines()[-2:]
    assert before == "False"  # kronos-tune plan traces fake steps on random tensors: no table, no pandas
    assert after == "True True pandas"  # the deferred name is the module itself once read


def test_the_optional_table_is_pyproject_extras() -> None:
    from kronos_core.optional import EXTRAS

    required, extras = declared(ROOT / "pyproject.toml")
    assert set(EXTRAS) == set(extras) - {"dev"}
    for extra, (distribution, module) in EXTRAS.items():
        assert _requirement_name(distribution) in extras[extra], extra
        assert distributions_of(module.split(".")[0]) & extras[extra], extra
    # decided once: a prediction's Parquet work folder (whatever --out is), the statistics, YAML configs
    for package in CORE_NOT_EXTRA:
        assert package in required and package not in set().union(*extras.values()), package


def _guarded_imports(file: Path, root: Path = ROOT) -> list[str]:
    """The modules imported inside a try block that catches ImportError (or a broader class)."""
    caught = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
    found = []
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Try):
            continue
        names = set()
        for handler in node.handlers:
            types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
            names |= {t.id for t in types if isinstance(t, ast.Name)} | ({"BaseException"} if handler.type is None
                                                                          else set())
        if names & caught:
            found += [f"{file.relative_to(root)}:{inner.lineno} {name}" for part in node.body
                      for inner in ast.walk(part) for name in _imported(inner)]
    return found


def test_every_optional_import_goes_through_the_one_helper() -> None:
    from kronos_core.optional import EXTRAS

    # an extra's module, or one of the packages decided core, which no code may treat as optional
    optional = {module.split(".")[0] for _, module in EXTRAS.values()} | {"pyarrow", "scipy", "yaml"}
    helper = ROOT / "kronos_core" / "optional.py"
    guarded = [g for file in sources("kronos_core") + sources("kronos_tune") if file != helper
               for g in _guarded_imports(file) if g.rsplit(" ", 1)[1] in optional]
    assert guarded == []  # kronos_core.optional.require / missing say what is missing, in one line


def test_the_guard_check_sees_a_try_around_an_import(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text("try:\n    import matplotlib\nexcept (ValueError, ImportError):\n    pass\n"
                      "try:\n    import ray\nexcept KeyError:\n    pass\n"
                      "try:\n    from scipy import stats\nexcept:\n    pass\n", encoding="utf-8")
    assert _guarded_imports(module, tmp_path) == ["probe.py:2 matplotlib", "probe.py:10 scipy"]
