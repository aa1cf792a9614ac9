"""Generate the blocking twins (the locks, the combiner) from their asyncio sources with ``unasync``.

    python scripts/unasync_locks.py          # write every twin below
    python scripts/unasync_locks.py --check  # exit 1 if one is not what its source generates

``locks/_async/locks.py`` generates ``locks/_sync/locks.py`` and ``locks/_async/base.py`` generates
``locks/_sync/base.py`` (each folder's ``io.py`` is written by hand: its I/O differs);
``inventory/combining/_async.py`` generates ``inventory/combining/_sync.py`` and ``_async_shared.py`` (the
shared queue) generates ``_sync_shared.py`` (their waits are in the hand-written ``_async_io.py`` and
``_sync_io.py``). ``unasync``
drops ``async``/``await`` and renames ``__aenter__``/``__aexit__``; the replacements below rename the
asyncio classes to their blocking twins (the modules keep their names, one folder each). The result has its imports
sorted and is formatted by ``ruff`` (the project's settings, pyproject.toml), so the twins pass
``make test``'s lint and format checks. ``make twins`` runs the first form; tests/locks/test_twins.py
runs the second, so ``make test`` fails if the twins diverge.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tokenize_rt
import unasync

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "locks"
COMBINING = ROOT / "inventory" / "combining"
#: asyncio source → generated blocking twin.
TWINS = {
    LOCKS / "_async" / "locks.py": LOCKS / "_sync" / "locks.py",
    LOCKS / "_async" / "base.py": LOCKS / "_sync" / "base.py",
    COMBINING / "_async.py": COMBINING / "_sync.py",
    COMBINING / "_async_shared.py": COMBINING / "_sync_shared.py",
}
REPLACEMENTS = {
    "AsyncRedisLock": "RedisLock",
    "AsyncRedlock": "Redlock",
    "AsyncCombiner": "Combiner",
    "AsyncSharedQueue": "SharedQueue",
    "_async_shared": "_sync_shared",
    "alead_batch": "lead_batch",
    "aguard": "guard",
    "_async_io": "_sync_io",
}


def header(source: Path) -> str:
    name = source.relative_to(source.parents[1])
    return (
        f"# Generated from {name} by scripts/unasync_locks.py (make twins): do not edit;\n"
        f"# edit {name} and regenerate.\n"
    )


def generate(source: Path, target: Path) -> str:
    rule = unasync.Rule(fromdir="/", todir="/", additional_replacements=REPLACEMENTS)
    tokens = rule._unasync_tokens(tokenize_rt.src_to_tokens(source.read_text()))
    return formatted(header(source) + tokenize_rt.tokens_to_src(tokens), target)


def formatted(source: str, target: Path) -> str:
    """``source`` with its imports sorted and formatted as ``ruff`` does with the project's pyproject.toml
    (renaming a module can move its import out of order)."""
    for command in (["check", "--select", "I", "--fix", "--exit-zero", "--quiet"], ["format"]):
        result = subprocess.run(
            [sys.executable, "-m", "ruff", *command, "--stdin-filename", str(target), "-"],
            input=source,
            capture_output=True,
            text=True,
            cwd=LOCKS.parent,
        )
        if result.returncode != 0:
            raise SystemExit(f"ruff {command[0]} failed on the generated {target.name}: {result.stderr.strip()}")
        source = result.stdout
    return source


def main(argv: list[str]) -> int:
    if argv not in ([], ["--check"]):
        print("usage: unasync_locks.py [--check]", file=sys.stderr)
        return 2
    stale = []
    for source, target in TWINS.items():
        text = generate(source, target)
        if argv == ["--check"]:
            if not target.exists() or target.read_text() != text:
                stale.append(f"{target} is not generated from {source.name}")
        else:
            target.write_text(text)
    if stale:
        print("; ".join(stale) + ": run `make twins`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
