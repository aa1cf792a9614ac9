"""The options of ``manage.py flashsale`` (what they mean is in docs/burst.md, docs/batching.md,
docs/distributed.md and docs/faults.md); :mod:`loadtests.options` checks their values."""

from __future__ import annotations

from faults.base import FAULT_STRATEGIES, OVERSELL_UNFENCED
from faults.registry import FAULT_NAMES
from loadtests.plan import SCENARIOS, BurstPlan
from processes.ports import LOCUST_MASTER_PORT


def add_arguments(parser) -> None:
    """Every option of ``flashsale``: the sale and its pods, then how it runs, batching, faults."""
    parser.add_argument("--scenario", default="spike", help=f"one of {', '.join(SCENARIOS)} (default spike)")
    parser.add_argument(
        "--strategies",
        "--backends",  # the older name, still accepted
        dest="strategies",
        default="db,redis,redlock",
        help="comma-separated strategies, or all (every strategy that is not a control); older name --backends",
    )
    parser.add_argument("--requests", type=int, default=5000, help="purchases per row (default 5000)")
    parser.add_argument("--stock", type=int, default=100, help="units on sale (default 100; deep: = --requests)")
    parser.add_argument("--sku", default="flash-burst", help="the burst's own product, created if missing")
    parser.add_argument("--pods", type=int, default=1, help="independent gunicorn instances (default 1)")
    parser.add_argument(
        "--users",
        type=int,
        default=BurstPlan.users,
        help=f"closed-loop concurrency for deep and flash (default {BurstPlan.users})",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=BurstPlan.workers,
        help=f"gunicorn worker processes per pod (default {BurstPlan.workers})",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=BurstPlan.threads,
        help=f"threads per gunicorn worker for the floor and BATCH=1 rows (default {BurstPlan.threads})",
    )
    add_run_arguments(parser)
    add_batch_arguments(parser)
    add_fault_arguments(parser)


def add_run_arguments(parser) -> None:
    """The load generator, the balancer, repeats, the timeout and the outputs."""
    parser.add_argument(
        "--locust-workers",
        type=int,
        default=None,
        help="Locust workers under one Locust master (default: one per 2,500 spike shoppers, 1 for closed loops)",
    )
    parser.add_argument(
        "--balancer",
        default="none",
        help="how shoppers reach the pods: none (each straight to one) or haproxy; a list "
        "(none,haproxy) runs every row through each, interleaved",
    )
    parser.add_argument(
        "--master-port", type=int, default=LOCUST_MASTER_PORT, help="the Locust master's port for its workers"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every row N times; print the median and range, and keep every repeat in the JSON (repeats)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="give up on a row's burst this many seconds after the opening (default: 180, or 50 ms a request)",
    )
    parser.add_argument("--json", dest="json_path", default="", help="write the runs as JSON here")
    parser.add_argument(
        "--report",
        dest="report_path",
        default="",
        help="write the self-contained HTML report here (e.g. artifacts/report.html)",
    )


def add_batch_arguments(parser) -> None:
    """--batch-threads and --batch: purchases sharing sections."""
    parser.add_argument(
        "--batch-threads",
        type=int,
        default=None,
        help="threads per gunicorn worker for rows with a --batch size above 1 (default: enough for every "
        "closed-loop shopper to be inside a worker at once, as a batch is one worker's threads)",
    )
    parser.add_argument(
        "--no-floor",
        dest="floor_round",
        action="store_false",
        help="no floor round before each row's purchases (no ×floor; faster, e.g. for long deep runs)",
    )
    parser.add_argument(
        "--yardstick",
        action="store_true",
        help="after each row's Locust run, the plain client (loadtests/yardstick.py) on the floor endpoint of "
        "the same pods: the Locust floor round is read against it (column 'yard s')",
    )
    parser.add_argument(
        "--batch",
        default="1",
        help="comma-separated BATCH sizes to run every strategy at, e.g. 1,64 (default 1: each purchase "
        "in its own section); docs/batching.md",
    )


def add_fault_arguments(parser) -> None:
    """--fault and --unfenced, after the others."""
    parser.add_argument(
        "--fault",
        choices=FAULT_NAMES,
        default=None,
        metavar="NAME",
        help="inject a fault into every row of the deep scenario and report before/during/after: "
        + ", ".join(f"{name} ({'/'.join(sorted(FAULT_STRATEGIES[name]))})" for name in FAULT_NAMES),
    )
    parser.add_argument(
        "--fault-hold",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long the fault lasts before its recovery (default: the fault's own; 0.1 s for the "
        "crash-and-restart faults restart-redis and kill-majority)",
    )
    parser.add_argument(
        "--unfenced",
        action="store_true",
        help="run the pods with the storage check off (INVENTORY_FENCED=0): with "
        f"{' and '.join(sorted(OVERSELL_UNFENCED))} the audit is expected to fail",
    )
