"""Instructions one acquire + release costs the client, counted by valgrind: lockbench's rows without its noise.

    .venv/bin/python scripts/lock_instructions.py [--ops 2000] [--cases floor-1node-fenced,ours-redis,...]

``lockbench`` times its rows, and on these VMs a round trip's wake-up moves its figures by a tenth
between runs, so a change to the library's Python that saves a tenth of an operation cannot be seen
in one run. This counts instead: each case is a child process under valgrind's callgrind, which
counts the instructions the client executes, the same count for the same work however loaded the
machine is (the nodes' own work is not counted: they are other processes). A case is built by the
same function as its ``lockbench`` row (a new lock object per operation, as the shop uses them),
against five private nodes on lockbench's ports (run one at a time), and each runs twice: with a
warm-up alone and with ``--ops`` more; the difference over ``--ops`` is one operation's count.
The last column compares each case with the fenced floor of as many nodes: the same scripts in the
same round trips, with no library around them, so what is above 1 is the library's own Python.
About 20 s a case. Needs valgrind (``apt-get install valgrind``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WARM_UP = 200
#: Each case, and the floor it is read against (the same scripts, no library).
CASES = {
    "floor-1node-fenced": "floor-1node-fenced",
    "ours-redis": "floor-1node-fenced",
    "floor-5nodes-fenced": "floor-5nodes-fenced",
    "ours-redlock": "floor-5nodes-fenced",
}


def _child(case: str, ops: int, ports: list[int]) -> None:
    import django

    django.setup()
    from loadtests.management.commands.lockbench import library_cases

    op = library_cases(ports)[case]
    for _ in range(WARM_UP + ops):
        op()


def _instructions(case: str, ops: int, ports: list[int], out: str) -> int:
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/callgrind.%p"]
    command += [sys.executable, __file__, "--child", case, "--ops", str(ops), "--ports", ",".join(map(str, ports))]
    # One hash seed for every child: dict layouts, and so the counts, then repeat to 0.1 %, not 3 %.
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        sys.exit(f"lock_instructions: {case} failed under valgrind ({last})")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="2000", help="operations counted per case (default 2000)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # the warm-up's child counts 0 operations
        return _child(args.child, int(args.ops), [int(port) for port in args.ports.split(",")])
    ops = int(args.ops) if args.ops.isdigit() else 0
    if ops < 1:
        parser.exit(2, f"lock_instructions: --ops must be a whole number, 1 or more, not {args.ops!r}\n")
    cases = [case.strip() for case in args.cases.split(",") if case.strip()]
    unknown = [case for case in cases if case not in CASES]
    if unknown or not cases:
        parser.exit(
            2, f"lock_instructions: unknown case {', '.join(unknown) or '(none)'}; choose from {', '.join(CASES)}\n"
        )
    if shutil.which("valgrind") is None:
        parser.exit(1, "lock_instructions: valgrind is not installed (apt-get install valgrind)\n")

    from processes.nodes import RedisNodes
    from processes.ports import LOCKBENCH_BASE_PORT

    with tempfile.TemporaryDirectory() as run_dir:
        nodes = RedisNodes(base_port=LOCKBENCH_BASE_PORT, count=5, run_dir=run_dir)
        nodes.start()
        try:
            ports = [node.port for node in nodes]
            counted: dict[str, float] = {}
            print(f"client instructions per acquire + release ({ops} operations a case, callgrind)")
            print(f"{'case':<22}{'instructions':>14}{'x its fenced floor':>20}")
            for case in cases:
                print(f"\r\033[K{case} ...", end="", file=sys.stderr, flush=True)
                base = _instructions(case, 0, ports, run_dir)
                counted[case] = (_instructions(case, ops, ports, run_dir) - base) / ops
                print("\r\033[K", end="", file=sys.stderr, flush=True)
                floor = counted.get(CASES[case])
                ratio = f"{counted[case] / floor:>20.2f}" if floor else f"{'-':>20}"
                print(f"{case:<22}{counted[case]:>14,.0f}{ratio}", flush=True)
        finally:
            nodes.stop()


if __name__ == "__main__":
    main()
