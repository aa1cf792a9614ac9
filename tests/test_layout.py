"""The layout's rules that a reader cannot see at a glance: the lock package stands alone, and no
module reaches into another package's private names (the import contract, ``.importlinter``,
checks the direction of every import and is run by ``make test``)."""

from __future__ import annotations

import ast
import functools
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROOMS = ["shop", "inventory", "locks", "processes", "faults", "loadtests", "tests", "scripts"]
#: Tests of one private module, which they import by name (white-box), and why.
WHITE_BOX = {
    "tests/locks/test_redis_py.py": (
        "runs locks/_redis_py.py, and the asyncio reads' ETIMEDOUT path, against the installed redis-py"
    )
}
#: Modules that may import another package's private names, which package, and why.
INTERNALS = {
    "locks/_redis_py.py": (
        "redis",
        "the one module that uses redis-py beyond its documented API (its docstring lists each use)",
    )
}


def test_the_lock_package_imports_without_django():
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    code = "import sys, locks, locks.etcd; print(sorted(m for m in sys.modules if m.split('.')[0] == 'django'))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def package_of(path: Path) -> list[str]:
    return list(path.relative_to(ROOT).parent.parts)


def imported_module(node: ast.ImportFrom, path: Path) -> list[str]:
    if not node.level:
        return (node.module or "").split(".")
    base = package_of(path)[: len(package_of(path)) - node.level + 1]
    return base + (node.module.split(".") if node.module else [])


def crossings(path: Path) -> list[str]:
    """Imports in ``path`` of an underscore name or module that lives outside the importer's package."""
    found = []
    here = package_of(path)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            module = imported_module(node, path)
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            module, names = [], [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            parts = [*module, *name.split(".")]
            for depth, part in enumerate(parts):
                owner = parts[:depth]  # the package that holds the private part
                if private(part) and here[: len(owner)] != owner:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {'.'.join(parts)}")
                    break
    return found


def test_no_module_imports_another_packages_underscore_names():
    files = [path for room in ROOMS for path in (ROOT / room).rglob("*.py")]
    files = [path for path in files if str(path.relative_to(ROOT)) not in WHITE_BOX]
    assert len(files) > 100
    found = [found for path in files for found in crossings(path)]
    assert [line for line in found if not allowed_internal(line)] == []


def allowed_internal(line: str) -> bool:
    """``line`` (as :func:`crossings` words it) is an import :data:`INTERNALS` allows."""
    path, _, rest = line.partition(":")
    package = INTERNALS.get(path, (None, ""))[0]
    return package is not None and rest.split(" imports ", 1)[1].startswith(f"{package}.")


def test_the_rule_sees_a_crossing(tmp_path, monkeypatch):
    """The rule above can fail: an import of ``_core`` from outside ``locks`` is one."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "loadtests").mkdir()
    bad = tmp_path / "loadtests" / "bench.py"
    bad.write_text(
        "from locks._core import Script\nfrom locks import _helper\nfrom ._own import fine\nfrom .x import _y\n"
    )
    assert crossings(bad) == [
        "loadtests/bench.py:1 imports locks._core.Script",
        "loadtests/bench.py:2 imports locks._helper",
        "loadtests/bench.py:4 imports loadtests.x._y",
    ]


#: Packages whose ``__init__`` is a public API that gathers names from private modules.
FACADES = {
    "locks": "the lock library's public API (RedisLock, Redlock, their asyncio twins, the errors)",
    "inventory.combining": "the combiner's public API (Combiner and lead_batch, their asyncio sources)",
    "locks.scripts": "the Redis locks' Lua scripts and keys, public for raw senders (lockbench's fenced floors)",
}


def module_file(parts: list[str]) -> Path | None:
    for candidate in (ROOT.joinpath(*parts).with_suffix(".py"), ROOT.joinpath(*parts, "__init__.py")):
        if parts and candidate.is_file():
            return candidate
    return None


@functools.lru_cache(maxsize=None)
def defines(path: Path) -> frozenset[str]:
    """Names bound at ``path``'s top level other than by an import (parsed once per file)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                elements = target.elts if isinstance(target, ast.Tuple) else [target]
                names |= {element.id for element in elements if isinstance(element, ast.Name)}
    return frozenset(names)


def borrowed(path: Path) -> list[str]:
    """Names ``path`` imports from a project module that only imported them itself (a re-export)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        module = imported_module(node, path)
        source = module_file(module)
        if source is None or ".".join(module) in FACADES:
            continue
        for alias in node.names:
            if alias.name == "*":  # tests/settings.py extends the shop's settings
                continue
            if module_file([*module, alias.name]) is None and alias.name not in defines(source):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {alias.name} from {'.'.join(module)}")
    return found


def test_names_are_imported_from_the_module_that_defines_them():
    files = [path for room in ROOMS for path in (ROOT / room).rglob("*.py")]
    assert [found for path in files for found in borrowed(path)] == []


def test_the_rule_sees_a_re_export(tmp_path, monkeypatch):
    """The rule above can fail: ``c`` takes ``x`` from ``b``, which only imported it from ``a``."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "b.py").write_text("from .a import x\ny = x\n")
    (tmp_path / "pkg" / "c.py").write_text("from .a import x\nfrom .b import x, y\n")
    assert borrowed(tmp_path / "pkg" / "c.py") == ["pkg/c.py:2 imports x from pkg.b"]
