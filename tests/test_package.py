"""Package-level checks: public API, import direction between layers, README and CI agree."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import raykit

ROOT = Path(__file__).resolve().parents[1]
LAYER_OF = {"converters": "feature", "loaders": "feature", "trainer": "trainer"}
APP_MODULES = {"raykit.cli", "raykit.demo", "raykit.__main__"}


def _layer(module: str) -> str:
    parts = module.split(".")
    if module in APP_MODULES or parts[:2] in (["raykit", "cli"], ["raykit", "demo"]):
        return "app"
    if len(parts) > 1 and parts[1] in LAYER_OF:
        return parts[1]
    return "core"


ALLOWED = {
    "core": {"core"},
    "converters": {"core", "converters"},
    "loaders": {"core", "loaders"},
    "trainer": {"core", "loaders", "trainer"},
    "app": {"core", "converters", "loaders", "trainer", "app"},
}


def _raykit_modules() -> list[str]:
    return [m.name for m in pkgutil.walk_packages(raykit.__path__, "raykit.") if m.name != "raykit.__main__"]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return {name for name in found if name == "raykit" or name.startswith("raykit.")}


def test_import_direction() -> None:
    bad = []
    for path in sorted((ROOT / "raykit").rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        module = ".".join(parts)
        layer = _layer(module)
        for imported in _imports(path):
            if imported == "raykit":
                continue
            if _layer(imported) not in ALLOWED[layer]:
                bad.append(f"{module} ({layer}) imports {imported} ({_layer(imported)})")
    assert bad == []


@pytest.mark.parametrize("name", _raykit_modules())
def test_all_names_exist(name: str) -> None:
    module = importlib.import_module(name)
    for exported in getattr(module, "__all__", []):
        assert hasattr(module, exported), f"{name}.__all__ names {exported!r}, which does not exist"


def test_readme_test_command_is_ci() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci in readme
    assert 'pip install -e ".[dev]"' in ci and "pytest" in ci


def test_cli_lists_every_subcommand() -> None:
    from raykit.cli import build_parser

    parser = build_parser()
    assert parser.prog == "raykit"


def test_generated_docs_are_current() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "gen_docs.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_readme_mentions_every_subcommand() -> None:
    from raykit.cli import build_parser

    parser = build_parser()
    readme = (ROOT / "README.md").read_text()
    subparsers = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name in subparsers.choices:
        assert f"raykit {name}" in readme
