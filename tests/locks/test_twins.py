"""The blocking twin is generated from the asyncio one: fail when ``locks/_sync/`` is stale or hand-edited."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "unasync_locks.py"


def test_sync_module_is_generated_from_the_asyncio_source():
    result = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
