"""Generate inventory/locks/sync.py from inventory/locks/aio.py with ``unasync``.

    python scripts/unasync_locks.py          # write sync.py
    python scripts/unasync_locks.py --check  # exit 1 if sync.py is not what aio.py generates

``unasync`` drops ``async``/``await`` and renames ``__aenter__``/``__aexit__``; the replacements
below rename the asyncio I/O module and classes to their blocking twins. The result goes through
``ruff format`` (the project's formatter, pyproject.toml) so the twin passes ``make test``'s format
check. ``make twins`` runs the first form; tests/locks/test_twins.py runs the second, so ``make test``
fails if the twins diverge.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tokenize_rt
import unasync

LOCKS = Path(__file__).resolve().parents[1] / "inventory" / "locks"
SOURCE = LOCKS / "aio.py"
TARGET = LOCKS / "sync.py"
REPLACEMENTS = {
    "_aio_io": "_sync_io",
    "AsyncRedisLock": "RedisLock",
    "AsyncRedlock": "Redlock",
}
HEADER = "# Generated from aio.py by scripts/unasync_locks.py (make twins): do not edit; edit aio.py and regenerate.\n"


def generate() -> str:
    rule = unasync.Rule(fromdir="/", todir="/", additional_replacements=REPLACEMENTS)
    tokens = rule._unasync_tokens(tokenize_rt.src_to_tokens(SOURCE.read_text()))
    return formatted(HEADER + tokenize_rt.tokens_to_src(tokens))


def formatted(source: str) -> str:
    """``source`` as ``ruff format`` writes it, with the settings of the project's pyproject.toml."""
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(TARGET), "-"],
        input=source,
        capture_output=True,
        text=True,
        cwd=LOCKS.parents[1],
    )
    if result.returncode != 0:
        raise SystemExit(f"ruff format failed on the generated twin: {result.stderr.strip()}")
    return result.stdout


def main(argv: list[str]) -> int:
    text = generate()
    if argv == ["--check"]:
        if not TARGET.exists() or TARGET.read_text() != text:
            print(f"{TARGET} is not generated from {SOURCE.name}: run `make twins`", file=sys.stderr)
            return 1
        return 0
    if argv:
        print("usage: unasync_locks.py [--check]", file=sys.stderr)
        return 2
    TARGET.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
