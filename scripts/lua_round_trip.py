"""What one Lua round trip costs against a plain command, on one Redis node or on several at once.

``lockbench``'s ``floor-1node`` takes the lock with a plain ``SET NX PX``; our lock takes it with
the ``ACQUIRE`` script (``SET NX PX`` and the fence's ``INCR`` in one atomic step). This prints the
wall time of one acquire-shaped command followed by a ``DEL``, one client, one connection, no
pipelining, in interleaved slices so that the machine's drift falls on every row alike:

* ``SET NX PX``: the floor's acquire;
* ``EVALSHA`` of a script that only does that ``SET``: the price of entering Lua at all;
* ``EVALSHA`` of ``SET`` then ``INCR``: a fenced acquire, nothing else;
* our ``ACQUIRE`` (hand-off window, waiter bookkeeping, fence);
* ``MULTI`` / ``SET NX PX`` / ``INCR`` / ``EXEC``: the same two writes without Lua, in one round
  trip (the fence is then issued even when the ``SET`` is refused).

With ``--url`` given more than once (five Redlock nodes, say), each command goes to every node
before any reply is read, as a Redlock round does and ``lockbench``'s ``floor-5nodes``: how much
of ``Redlock``'s gap to that floor is its fenced acquire, and how much the cheapest fence (no Lua)
would leave.

Usage: ``PYTHONPATH=. .venv/bin/python scripts/lua_round_trip.py [--url redis://127.0.0.1:6379/15
...] [--slices 40] [--ops 200]``. Writes and deletes two keys under ``lua_round_trip:`` on each node.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Callable

import redis
from hiredis import pack_command

from locks.scripts import ACQUIRE, acquire_keys

NAME = "lua_round_trip:lock"
DEFAULT_URL = "redis://127.0.0.1:6379/15"
TTL_MS = 10_000
SET_ONLY = "return redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])"
SET_INCR = (
    "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return redis.call('incr', KEYS[2]) end return 0"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url", action="append", help=f"a Redis node; again for each node of a round (default {DEFAULT_URL})"
    )
    parser.add_argument("--slices", type=int, default=40, help="interleaved slices per row (default %(default)s)")
    parser.add_argument("--ops", type=int, default=200, help="operations per slice (default %(default)s)")
    args = parser.parse_args(argv)
    if args.slices < 1 or args.ops < 1:
        said = f"--slices and --ops must be 1 or more, not {args.slices} and {args.ops}"
        print(f"lua_round_trip: {said}", file=sys.stderr)
        return 2
    urls, clients = args.url or [DEFAULT_URL], []
    for url in urls:
        try:
            clients.append(redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0))
        except ValueError as exc:
            print(f"lua_round_trip: --url {url!r}: {exc}", file=sys.stderr)
            return 2
    try:
        rows = _rows(clients)
    except redis.RedisError as exc:
        print(f"lua_round_trip: cannot use {' '.join(urls)}: {exc}", file=sys.stderr)
        return 1
    slices = _measure(clients, rows, slices=args.slices, ops=args.ops)
    floor = statistics.median(slices["SET NX PX"])
    on = urls[0] if len(urls) == 1 else f"{len(urls)} nodes at once: {' '.join(urls)}"
    print(f"one command + DEL, median of {args.slices} slices of {args.ops} ({on})")
    for row, values in slices.items():
        median = statistics.median(values)
        print(f"  {row:22} {median:7.1f} us   {floor / median:5.2f}x SET NX PX")
    return 0


def _rows(clients: list[redis.Redis]) -> dict[str, Callable[[str], list[bytes]]]:
    """Each row's command for a token, packed; loads the scripts on every node first."""
    for client in clients:
        set_only, set_incr = client.script_load(SET_ONLY), client.script_load(SET_INCR)
        client.script_load(ACQUIRE.text)
    keys = acquire_keys(NAME)
    return {
        "SET NX PX": lambda token: [pack_command(("SET", NAME, token, "NX", "PX", TTL_MS))],
        "EVALSHA: SET": lambda token: [pack_command(("EVALSHA", set_only, 1, NAME, token, TTL_MS))],
        "EVALSHA: SET + INCR": lambda token: [pack_command(("EVALSHA", set_incr, 2, *keys[:2], token, TTL_MS))],
        "EVALSHA: our ACQUIRE": lambda token: [
            pack_command(("EVALSHA", ACQUIRE.sha, 4, *keys, token, TTL_MS, "", "0"))
        ],
        "MULTI SET INCR EXEC": lambda token: [
            pack_command(("MULTI",)),
            pack_command(("SET", NAME, token, "NX", "PX", TTL_MS)),
            pack_command(("INCR", keys[1])),
            pack_command(("EXEC",)),
        ],
    }


def _measure(clients: list[redis.Redis], rows: dict, *, slices: int, ops: int) -> dict[str, list[float]]:
    """Microseconds per command + DEL (sent to every node before a reply is read), a value per
    slice for each row, the rows interleaved."""
    conns = [client.connection_pool.get_connection() for client in clients]

    def ask(*packed: bytes) -> None:
        for conn in conns:
            conn.send_packed_command(list(packed), check_health=False)
        for conn in conns:
            for _ in packed:
                conn.read_response()

    delete = pack_command(("DEL", NAME))
    measured: dict[str, list[float]] = {row: [] for row in rows}
    try:
        for index in range(slices):
            print(f"\r\033[Kslice {index + 1}/{slices}", end="", file=sys.stderr, flush=True)
            for row, command in rows.items():
                started = time.perf_counter()
                for op in range(ops):
                    ask(*command(f"{index}-{op}"))
                    ask(delete)
                measured[row].append((time.perf_counter() - started) / ops * 1e6)
    finally:
        print("\r\033[K", end="", file=sys.stderr)
        for client, conn in zip(clients, conns, strict=True):
            client.connection_pool.release(conn)
            client.delete(*acquire_keys(NAME))
    return measured


if __name__ == "__main__":
    sys.exit(main())
