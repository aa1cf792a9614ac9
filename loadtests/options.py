"""The options of ``manage.py flashsale``, in one place: the options themselves
(:func:`add_arguments`; what they mean is in docs/burst.md, docs/batching.md, docs/distributed.md
and docs/faults.md), the checks of their values before anything starts (each refuses with
:class:`~django.core.management.base.CommandError`), and the rows they plan (:func:`planned_rows`)."""

from __future__ import annotations

import contextlib
import math
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from django.core.management.base import CommandError

from faults.base import FAULT_STRATEGIES, OVERSELL_UNFENCED
from faults.registry import FAULT_NAMES
from inventory.models import Product
from inventory.services import MAX_STOCK
from inventory.strategies import STRATEGIES, strategy_class
from inventory.strategies.base import QUEUES
from inventory.strategies.fenced import FencedLockStrategy
from loadtests.balancer import BalancerError, haproxy_binary
from loadtests.faultrun import PAUSE_LEASE_DEFAULT_MS, PAUSE_LEASE_MS
from loadtests.plan import BALANCERS, SCENARIOS, SERVERS, BurstPlan, default_locust_workers
from processes.ports import LOCUST_MASTER_PORT

SKU_PATTERN = re.compile(r"^[-a-zA-Z0-9_]{1,64}$")
#: Units on sale when --stock is not given (deep puts --requests on the shelf and takes no --stock).
DEFAULT_STOCK = 100


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
    parser.add_argument(
        "--stock",
        type=int,
        default=None,
        help=f"units on sale (default {DEFAULT_STOCK}); not with deep, which puts one on the shelf per purchase",
    )
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
        "--server",
        default="wsgi",
        help="the pods' server: wsgi (gunicorn's threads) or asgi (gunicorn with uvicorn workers, the purchase "
        "on the event loop); a list (wsgi,asgi) runs every row on each, side by side",
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
        "--sales",
        type=int,
        default=1,
        help="sell N times in each row, on the same pods and prepared shoppers, each sale of its own product "
        "right after a floor round on it: the row is the median sale, read against the best floor round",
    )
    parser.add_argument(
        "--steadiness",
        action="store_true",
        help="before the rows, time one fixed CPU job a few times (loadtests/steadiness.py, about 4 s) and print "
        "how much this machine's speed varies: the noise any two runs' ×floor share",
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
    """--batch-workers, --batch-threads and --batch: purchases sharing sections."""
    parser.add_argument(
        "--batch-workers",
        type=int,
        default=None,
        help="gunicorn workers per pod for rows with a --batch size above 1 (default: --workers); a batch "
        "is one worker's queue, so fewer workers make fewer, larger batches",
    )
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
        "--hot-row",
        dest="hot_row",
        action="store_true",
        help="deep only: before the strategy rows, the hot-row limit (loadtests/hotrow.py: plain psycopg on the "
        "burst's product, one purchase per commit and the largest --batch size, or 64, per commit) as two rows; "
        "every row's hot_row_ratio in the JSON",
    )
    parser.add_argument(
        "--batch",
        default="1",
        help="comma-separated BATCH sizes to run every strategy at, e.g. 1,64 (default 1: each purchase "
        "in its own section); docs/batching.md",
    )
    parser.add_argument(
        "--queue",
        default=None,
        help="where the purchases of the rows with a --batch size above 1 queue: local (each worker's own "
        "queue, the default), shared (one Redis list per SKU for every worker and pod), or both (local,shared: "
        "a row each); only with such a size; docs/batching.md",
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


def strategy_names(*, scenario: str, strategies: str) -> list[str]:
    """The strategies --strategies names (all: every one that is not a control), after checking --scenario."""
    if scenario not in SCENARIOS:
        raise CommandError(f"--scenario {scenario!r}: use one of {', '.join(SCENARIOS)}")
    if strategies.strip() == "all":
        strategies = ",".join(name for name in STRATEGIES if not strategy_class(name).control)
    names = [name.strip() for name in strategies.split(",") if name.strip()]
    unknown = [name for name in names if name not in STRATEGIES]
    if not names or unknown:
        raise CommandError(f"unknown strategy {', '.join(unknown) or '(none given)'}: use {', '.join(STRATEGIES)}")
    if len(set(names)) != len(names):
        raise CommandError(f"--strategies names a strategy twice: {strategies}")
    return names


def batch_sizes(text: str) -> list[int]:
    """``--batch 1,64`` → [1, 64]: whole numbers, 1 or more, none twice."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1 or len(set(sizes)) != len(sizes):
        raise CommandError(f"--batch {text!r}: give sizes of 1 or more, each once, e.g. --batch 1,64")
    return sizes


def queue_kinds(text: str) -> list[str]:
    """``--queue local,shared`` → ["local", "shared"]: each a kind of queue, once."""
    kinds = [part.strip() for part in text.split(",") if part.strip()]
    if not kinds or set(kinds) - set(QUEUES) or len(set(kinds)) != len(kinds):
        raise CommandError(f"--queue {text!r}: use one or both of {', '.join(QUEUES)}, each once")
    return kinds


def row_keys(names: list[str], sizes: list[int], queues: list[str]) -> list[tuple[str, int, str]]:
    """Every row's key (strategy, BATCH size, queue): a batched row once per queue, a BATCH=1 row
    (which queues nowhere) once, as ``local``."""
    return [(name, size, queue) for name in names for size in sizes for queue in (queues if size > 1 else ["local"])]


@dataclass(frozen=True)
class BatchLayout:
    """The pods of the rows whose purchases share sections: workers per pod, threads per worker."""

    workers: int
    threads: int

    def __str__(self) -> str:
        return f"{self.workers} workers × {self.threads} threads"


def layout_for_batches(
    workers_given: int | None, threads_given: int | None, *, threads: int, users: int, pods: int, workers: int
) -> BatchLayout:
    """The batched rows' layout: --batch-workers as given, else --workers; --batch-threads as given,
    else enough for every closed-loop shopper to be inside a worker at once (a batch is one
    worker's threads), and never fewer than --threads."""
    for flag, given in (("--batch-workers", workers_given), ("--batch-threads", threads_given)):
        if given is not None and given < 1:
            raise CommandError(f"{flag} must be 1 or more, not {given}")
    batch_workers = workers if workers_given is None else workers_given
    if threads_given is not None:
        return BatchLayout(batch_workers, threads_given)
    return BatchLayout(batch_workers, max(threads, math.ceil(users / (pods * batch_workers))))


def row_plan(plan: BurstPlan, size: int, batched: BatchLayout, queue: str = "local") -> BurstPlan:
    """The plan of a row at BATCH ``size`` on ``queue``: batched rows run on the ``batched`` layout,
    and no row's pool is larger than its threads."""
    layout = BatchLayout(plan.workers, plan.threads) if size == 1 else batched
    return replace(
        plan,
        batch=size,
        queue=queue,
        workers=layout.workers,
        threads=layout.threads,
        pool_max_size=min(layout.threads, plan.pool_max_size),
    )


def check_numbers(
    *,
    scenario: str,
    requests: int,
    stock: int,
    users: int,
    workers: int,
    threads: int,
    pods: int,
    locust_workers: int | None,
    repeat: int,
    timeout: float | None,
    sales: int = 1,
) -> tuple[float, int]:
    """Refuse a number below its least value; the timeout and Locust workers, defaults filled in."""
    if timeout is None:
        timeout = max(BurstPlan.timeout_s, requests * 0.05)
    if locust_workers is None:
        locust_workers = default_locust_workers(scenario=scenario, requests=requests)
    for flag, value, least in (
        ("--requests", requests, 1),
        ("--stock", stock, 0),
        ("--users", users, 1),
        ("--workers", workers, 1),
        ("--threads", threads, 1),
        ("--pods", pods, 1),
        ("--locust-workers", locust_workers, 1),
        ("--repeat", repeat, 1),
        ("--sales", sales, 1),
        ("--timeout", timeout, 1),
    ):
        if not value >= least or not math.isfinite(value):  # nan compares false, inf never ends
            raise CommandError(f"{flag} must be {least} or more, not {value:g}")
    shelf, flag = (requests, "--requests") if scenario == "deep" else (stock, "--stock")  # deep: a unit a purchase
    if shelf > MAX_STOCK:
        raise CommandError(f"{flag} {shelf}: the units on sale would be more than the stock column holds, {MAX_STOCK}")
    if locust_workers > requests:
        raise CommandError(f"--locust-workers {locust_workers} is more than --requests {requests}")
    return timeout, locust_workers


def check_paths(*, sku: str, json_path: str, report_path: str) -> None:
    """Refuse a --sku that is not a plain name, and a --json or --report that cannot be written."""
    if not SKU_PATTERN.match(sku):
        raise CommandError(f"--sku {sku!r}: use letters, digits, - and _ (at most 64)")
    for flag, value, example in (
        ("--json", json_path, "artifacts/burst.json"),
        ("--report", report_path, "artifacts/report.html"),
    ):
        if value and Path(value).is_dir():
            raise CommandError(f"{flag} {value} is a folder: give a file path, e.g. {example}")
        check_output(flag, value)
    if report_path:  # Locust's own reports are copied into locust/ beside it
        try_writing_in(Path(report_path).absolute().parent / "locust", "--report", report_path)
    if json_path and report_path and Path(json_path).resolve() == Path(report_path).resolve():
        raise CommandError(f"--report {report_path}: is the --json file too: give each its own file")


def check_sku_free(sku: str, *, sales: int) -> None:
    """Refuse a --sku whose sale products (``sku``, then ``sku-2``... with --sales) are too long for
    the sku column, or include one of the shop's own, listed on its home page: the burst resets its
    products' sales (every order deleted), renames them and takes them off the home page."""
    skus = [sku, *(f"{sku}-{number}" for number in range(2, sales + 1))]
    if not SKU_PATTERN.match(skus[-1]):
        raise CommandError(
            f"--sku {sku}: --sales {sales} names its sales' products up to {skus[-1]}, longer than 64 characters: "
            "give a shorter --sku"
        )
    taken = Product.objects.filter(sku__in=skus, listed=True).values_list("sku", flat=True).first()
    if taken is not None:
        raise CommandError(
            f"--sku {sku}: {taken} is a product of the shop (on its home page), and the burst resets its product's "
            "sale, deleting its orders: give the burst a sku of its own, e.g. the default flash-burst"
        )


def check_output(flag: str, value: str) -> None:
    """Refuse an output file that cannot be written (a folder, a path under a file, a folder this
    process may not write in) before a run, not after it with its figures in a traceback. Its
    missing folders are made when it is written."""
    if not value:
        return
    target = Path(value).absolute()
    if target.is_dir():
        raise CommandError(f"{flag} {value}: is a folder: give a file path")
    if target.exists() and not target.is_file():  # a device or a pipe: writing renames a file over it
        raise CommandError(f"{flag} {value}: is not a regular file: give a file path")
    existing = next(parent for parent in target.parents if parent.exists())
    if not existing.is_dir():
        raise CommandError(f"{flag} {value}: {existing} is a file, not a folder: give a path in a folder")
    if not os.access(existing, os.W_OK):
        raise CommandError(f"{flag} {value}: this user may not write in {existing}")
    try_writing_in(target.parent, flag, value)


def try_writing_in(folder: Path, flag: str, value: str) -> None:
    """Make ``folder`` (with its missing parents) and a file in it, then remove what was made: the
    only sure answer to "may this be written?" (``os.access`` says yes to root under ``/proc``, where
    a folder cannot be made, and under ``/sys``). A refusal is one line, and leaves nothing behind."""
    made = [parent for parent in (folder, *folder.parents) if not parent.exists()][::-1]
    try:
        for parent in made:
            parent.mkdir()
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise CommandError(f"{flag} {value}: cannot write in {folder} ({exc.strerror or exc})") from None
    finally:
        for parent in reversed(made):
            with contextlib.suppress(OSError):
                parent.rmdir()


def check_fault(
    *, fault: str | None, unfenced: bool, scenario: str, names: list[str], hold_s: float | None = None
) -> None:
    """Refuse a fault outside the deep scenario or with a strategy it means nothing for, a
    --fault-hold without a fault or below 0, and --unfenced with a strategy that has no storage
    check to switch off."""
    if hold_s is not None and (fault is None or not 0 <= hold_s < math.inf):
        raise CommandError(
            f"--fault-hold {hold_s:g}: give 0 seconds or more" if fault else "--fault-hold needs a --fault"
        )
    if unfenced:
        plain = [name for name in names if not issubclass(strategy_class(name), FencedLockStrategy)]
        if plain:
            fenced = [name for name in STRATEGIES if issubclass(strategy_class(name), FencedLockStrategy)]
            raise CommandError(
                f"--unfenced switches off a lock strategy's fence; {', '.join(plain)} has none: "
                f"use --strategies from {','.join(fenced)}"
            )
    if fault is None:
        return
    if fault not in FAULT_NAMES:
        raise CommandError(f"unknown fault {fault!r}: use one of {', '.join(FAULT_NAMES)}")
    if scenario != "deep":
        raise CommandError(
            f"--fault runs in the deep scenario (every purchase through the lock): use --scenario deep, not {scenario}"
        )
    wrong = [name for name in names if name not in FAULT_STRATEGIES[fault]]
    if wrong:
        raise CommandError(
            f"--fault {fault} does not apply to {', '.join(wrong)}: "
            f"use --strategies {','.join(sorted(FAULT_STRATEGIES[fault]))}"
        )


def check_hot_row(*, hot_row: bool, scenario: str) -> None:
    """Refuse --hot-row outside the deep scenario: its rows sell --requests units, one per purchase."""
    if hot_row and scenario != "deep":
        raise CommandError(
            f"--hot-row runs in the deep scenario (one unit on the shelf per purchase): use --scenario deep, "
            f"not {scenario}"
        )


def check_used(*, scenario: str, stock: int | None, sizes: list[int], queue: str | None, layout: dict) -> None:
    """Refuse an option no row would use: --queue, --batch-workers or --batch-threads when every
    --batch size is 1 (a BATCH=1 row queues nowhere and runs on --workers and --threads), --stock
    with the deep scenario (its shelf is --requests, a unit a purchase)."""
    if queue is not None and max(sizes) == 1:
        raise CommandError(
            f"--queue {queue}: only a --batch size above 1 queues (a BATCH=1 row queues nowhere): "
            "add one, e.g. --batch 1,64, or drop --queue"
        )
    for flag, given in layout.items():
        if given is not None and max(sizes) == 1:
            kept = flag.replace("--batch-", "--")
            raise CommandError(
                f"{flag} {given}: only a row with a --batch size above 1 runs on it (a BATCH=1 row keeps "
                f"{kept}): add one, e.g. --batch 1,64, or drop {flag}"
            )
    if stock is not None and scenario == "deep":
        raise CommandError(
            f"--stock {stock}: the deep scenario puts one unit on the shelf per purchase (--requests): "
            "drop --stock, or sell --stock units with --scenario spike or flash"
        )


def check_fault_options(options: dict, *, names: list[str]) -> None:
    """Refuse what a fault run would ignore or fail on after its first rows: a --fault-hold for
    kill-holder (it kills three holders, each the moment one is found: it holds nothing), one that
    does not outlast pause-worker's lease for a strategy named, and --yardstick with --fault or
    --no-floor (its figure is read against the floor round, which neither runs)."""
    fault, hold_s = options.get("fault"), options.get("fault_hold")
    if fault == "kill-holder" and hold_s is not None:
        raise CommandError(
            f"--fault-hold {hold_s:g}: kill-holder holds nothing (it kills a holder, three times, as each is "
            "found): drop --fault-hold"
        )
    if fault == "pause-worker" and hold_s is not None:
        short = [name for name in names if hold_s * 1000 <= PAUSE_LEASE_MS.get(name, PAUSE_LEASE_DEFAULT_MS)]
        if short:
            leases = ", ".join(f"{name} {PAUSE_LEASE_MS.get(name, PAUSE_LEASE_DEFAULT_MS)} ms" for name in short)
            raise CommandError(
                f"--fault-hold {hold_s:g}: pause-worker must freeze a holder past its lease ({leases}): "
                "give a longer --fault-hold"
            )
    if options.get("yardstick") and (fault or not options.get("floor_round", True)):
        without = "--fault (a fault run has no floor round)" if fault else "--no-floor"
        raise CommandError(f"--yardstick is read against the floor round, which {without} leaves out: drop one")


def check_balancers(balancer: str, *, master_port: int) -> list[str]:
    """The balancers --balancer names (each once, HAProxy installed if named), after checking --master-port."""
    if not 1 <= master_port <= 65535:
        raise CommandError(f"--master-port {master_port}: use a port from 1 to 65535")
    names = [name.strip() for name in balancer.split(",") if name.strip()]
    unknown = [name for name in names if name not in BALANCERS]
    if not names or unknown or len(set(names)) != len(names):
        raise CommandError(f"--balancer {balancer!r}: use one or both of {', '.join(BALANCERS)}, each once")
    if "haproxy" in names:
        try:
            haproxy_binary()
        except BalancerError as exc:
            raise CommandError(str(exc)) from exc
    return names


def check_servers(server: str, *, names: list[str]) -> list[str]:
    """The servers --server names (each once), and no strategy on ASGI that would block its event loop."""
    servers = [name.strip() for name in server.split(",") if name.strip()]
    if not servers or set(servers) - set(SERVERS) or len(set(servers)) != len(servers):
        raise CommandError(f"--server {server!r}: use one or both of {', '.join(SERVERS)}, each once")
    blocking = [name for name in names if strategy_class(name).loop_refusal] if "asgi" in servers else []
    if blocking:
        reasons = "; ".join(f"{name}: {strategy_class(name).loop_refusal}" for name in blocking)
        raise CommandError(f"--server asgi cannot run {', '.join(blocking)} ({reasons}): run it with --server wsgi")
    return servers


@dataclass(frozen=True)
class Rows:
    """What ``flashsale`` runs: every row's plan but its BATCH size, queue and balancer, each row's key
    (strategy, BATCH size, queue), the balancers, and the threads per worker of the batched rows."""

    plan: BurstPlan
    keys: list[tuple[str, int, str]]
    balancers: list[str]
    batched: BatchLayout
    hot_row: bool = False  # the hot-row limit rows run first (deep only)
    servers: tuple[str, ...] = ("wsgi",)  # every row runs on each, in turn

    @property
    def vias(self) -> list[tuple[str, str]]:
        """How each row is run in turn: (balancer, server) pairs."""
        return [(balancer, server) for balancer in self.balancers for server in self.servers]


def planned_rows(options: dict, *, pool_size: Callable[..., int]) -> Rows:
    """Check ``flashsale``'s ``options`` (as Django passes them) and plan its rows; ``pool_size``
    (pods, workers, threads) gives the connections each gunicorn worker may open."""
    scenario, fault, unfenced = options["scenario"], options.get("fault"), options.get("unfenced", False)
    names = strategy_names(scenario=scenario, strategies=options["strategies"])
    sizes = batch_sizes(options.get("batch", "1"))
    keys = row_keys(names, sizes, queue_kinds(options.get("queue") or "local"))
    numbers = {name: options[name] for name in ("requests", "users", "workers", "threads", "pods")}
    numbers["stock"] = DEFAULT_STOCK if options.get("stock") is None else options["stock"]
    timeout, locust_workers = check_numbers(
        scenario=scenario,
        **numbers,
        locust_workers=options["locust_workers"],
        repeat=options["repeat"],
        timeout=options["timeout"],
        sales=options.get("sales", 1),
    )
    if fault and options.get("sales", 1) > 1:
        raise CommandError("--fault runs one sale a row (the fault is injected into it): drop --sales")
    check_paths(sku=options["sku"], json_path=options["json_path"], report_path=options.get("report_path", ""))
    check_sku_free(options["sku"], sales=options.get("sales", 1))
    balancers = check_balancers(options["balancer"], master_port=options["master_port"])
    servers = check_servers(options.get("server", "wsgi"), names=names)
    sizing = {name: numbers[name] for name in ("threads", "users", "pods", "workers")}
    batched = layout_for_batches(options.get("batch_workers"), options.get("batch_threads"), **sizing)
    check_fault(fault=fault, unfenced=unfenced, scenario=scenario, names=names, hold_s=options.get("fault_hold"))
    check_hot_row(hot_row=options.get("hot_row", False), scenario=scenario)
    layout = {"--batch-workers": options.get("batch_workers"), "--batch-threads": options.get("batch_threads")}
    check_used(scenario=scenario, stock=options.get("stock"), sizes=sizes, queue=options.get("queue"), layout=layout)
    check_fault_options(options, names=names)
    plan = BurstPlan(
        scenario=scenario,
        sku=options["sku"],
        **numbers,
        pool_max_size=pool_size(
            pods=numbers["pods"],
            workers=max(numbers["workers"], batched.workers),
            threads=max(numbers["threads"], batched.threads),
        ),
        locust_workers=locust_workers,
        master_port=options["master_port"],
        balancer=balancers[0],
        timeout_s=timeout,
        fault=fault,
        fault_hold_s=options.get("fault_hold"),
        fenced=not unfenced,
        yardstick=options.get("yardstick", False),
        floor_round=options.get("floor_round", True),
        sales=options.get("sales", 1),
    )
    return Rows(
        plan=plan,
        keys=keys,
        balancers=balancers,
        batched=batched,
        hot_row=options.get("hot_row", False),
        servers=tuple(servers),
    )
