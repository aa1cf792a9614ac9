"""What /proc says about a process: its state letter and its children (Linux)."""

from __future__ import annotations

import os


def process_state(pid: int) -> str:
    """The state letter /proc gives a process (R running, S sleeping, T stopped, ...); "" once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def child_pids(parent: int) -> list[int]:
    """Pids whose parent is ``parent`` (from /proc), in ascending order: a gunicorn master's workers."""
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == parent:
            children.append(int(entry))
    return sorted(children)
