"""Every module that declares `__all__` star-imports: each listed name exists (a name that moved away fails here)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def modules_with_all(root: Path, packages: tuple[str, ...]) -> list[str]:
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            declares = any(isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
                isinstance(target, ast.Name) and target.id == "__all__"
                for target in (node.targets if isinstance(node, ast.Assign) else [node.target]))
                for node in tree.body)
            if declares:
                parts = path.relative_to(root).with_suffix("").parts
                found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def star_import(root: Path, modules: list[str]) -> subprocess.CompletedProcess:
    """`from X import *` for each module, in one fresh interpreter started in `root`."""
    code = "\n".join(f"exec('from {name} import *', {{}})" for name in modules)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=300)


def test_star_import_of_every_module_with_all() -> None:
    modules = modules_with_all(ROOT, ("kronos_core", "kronos_tune"))
    assert "kronos_tune.predict.job" in modules and "kronos_core" in modules
    done = star_import(ROOT, modules)
    assert done.returncode == 0, done.stderr.strip().splitlines()[-1:]


def test_a_name_that_moved_away_is_caught(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "fine.py").write_text("__all__ = ['here']\nhere = 1\n")
    (package / "stale.py").write_text("__all__: list[str] = ['here', 'moved_away']\nhere = 1\n")
    modules = modules_with_all(tmp_path, ("pkg",))
    assert modules == ["pkg.fine", "pkg.stale"]
    done = star_import(tmp_path, modules)
    assert done.returncode != 0 and "moved_away" in done.stderr
