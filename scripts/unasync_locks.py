"""Generate the blocking lock modules from their asyncio sources with ``unasync``.

    python scripts/unasync_locks.py          # write sync.py and _sync_base.py
    python scripts/unasync_locks.py --check  # exit 1 if either is not what its source generates

``inventory/locks/aio.py`` generates ``sync.py`` and ``_aio_base.py`` generates ``_sync_base.py``.
``unasync`` drops ``async``/``await`` and renames ``__aenter__``/``__aexit__``; the replacements
below rename the asyncio modules and classes to their blocking twins. The result has its imports
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

LOCKS = Path(__file__).resolve().parents[1] / "inventory" / "locks"
#: asyncio source → generated blocking twin.
TWINS = {
    LOCKS / "aio.py": LOCKS / "sync.py",
    LOCKS / "_aio_base.py": LOCKS / "_sync_base.py",
}
REPLACEMENTS = {
    "_aio_io": "_sync_io",
    "_aio_base": "_sync_base",
    "AsyncRedisLock": "RedisLock",
    "AsyncRedlock": "Redlock",
}


def header(source: Path) -> str:
    return (
        f"# Generated from {source.name} by scripts/unasync_locks.py (make twins): do not edit; "
        f"edit {source.name} and regenerate.\n"
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
            cwd=LOCKS.parents[1],
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
