"""The flash sale's shoppers, on Locust's own master and workers (or one Locust process):
prepared before the sale opens, released together at the opening. How to run it by hand, with
workers on other machines or with Locust's web UI: docs/distributed.md.

1. Each worker spawns its users and tells the master how many (a custom message); the master
   gives each worker its share (``loadtests/conductor.py``): exactly ``--purchases`` in all
   (0, the default: one per user, so the user count typed into the web UI is the sale's size).
2. Every shopper is prepared: one ``GET /api/session`` over the user's connection sets the
   ``csrftoken`` cookie and the signed session cookie (the product page would set them too, but
   renders its whole HTML each time), and its purchase request is built. A worker whose shoppers
   are all prepared tells the master; once every worker has, the master waits ``--countdown``
   seconds and opens the gate with one message to all workers.
   ``--path`` may name several endpoints (comma-separated): the sale then runs one round per
   path, in order, with the same prepared shoppers and connections (``flashsale`` runs the floor
   endpoint, then the purchase, on the same pods); each round opens once the previous one is
   answered, with new Idempotency-Keys, and the summary keeps every round's figures.
3. ``--scenario spike``: at the opening each worker writes the first purchase of every user at
   once, each to its own connection that stayed open through the countdown; ``closed``: users
   post back to back (fixed concurrency).

Every purchase carries a random ``Idempotency-Key``. A 503 with ``Retry-After`` is resent with
the same key after waiting as told (``client_retries``). One that got no HTTP answer (refused,
reset, timed out: a killed worker or pod resets its connections) or a balancer's 502 (its pod
died) is resent with the same key over a new connection to the next host (``transport_resends``;
the wall-clock time of each is kept with the purchase). Both share the ``--max-retries`` bound:
at most one order per key. A resent purchase is counted once in ``sent``/``answered``/
``status_counts`` (with its final answer); one whose last try got no answer is a
``transport_error``. Workers report exact per-purchase figures through Locust's
``report_to_master`` / ``worker_report``; the master writes ``--progress-file`` every 0.1 s and
``--summary-json`` at the end. Locust's own ``--csv``/``--html`` count every exchange.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import secrets
import time
from pathlib import Path
from types import SimpleNamespace

import gevent
import gevent.event
import locust.runners
import locust.stats
from geventhttpclient.header import Headers
from geventhttpclient.response import HTTPParseError
from locust import User, constant, events, task
from locust.exception import StopUser
from locust.rpc import Message
from locust.runners import STATE_STOPPED, MasterRunner, WorkerRunner

# `loadtests.*` imports without editing sys.path: Locust puts the working directory first on it
# before loading a locustfile, and the locustfile runs from the project root (by hand, as in
# docs/distributed.md), or with PYTHONPATH set to it (loadtests/pods.py, the tests).
from inventory.limits import MAX_QUANTITY
from loadtests import messages
from loadtests.balancer import ANSWERED_BY
from loadtests.conductor import Conductor
from loadtests.connection import Connection, retry_after_s
from loadtests.sale import Sale
from loadtests.webui import hold_passing_polls

PAGE_NAME = "session"
PURCHASE_NAME = "purchase"
PROGRESS_INTERVAL_S = 0.1
PAGE_ATTEMPTS = 3
#: The longest Retry-After this client honours; a larger one is waited for this long.
MAX_RETRY_WAIT_S = 5.0
#: Wait before resending a purchase that got no answer, times the attempt.
RESEND_WAIT_S = 0.2
#: Between two rounds: the pods finish writing the previous round's access log lines.
ROUND_PAUSE_S = 0.3
#: A balancer's answer when the pod it sent the request to failed (the request may have run).
BAD_GATEWAY = 502
#: Locust has no option for these. A worker busy preparing thousands of shoppers on a starved
#: CPU may miss heartbeats for many seconds: the master keeps it (default: 3 s). Reports every
#: half second carry the purchases to the master and the progress to the runner (default 3 s).
locust.runners.HEARTBEAT_LIVENESS = 120
locust.runners.WORKER_REPORT_INTERVAL = 0.5
LOCAL = "local"
LOOPBACK = "127.0.0.1"


def add_arguments(parser) -> None:
    # Locust's web UI (it starts a sale against the shop) and its master's port listen on 127.0.0.1
    # unless told otherwise: --web-host and --master-bind-host open them to other machines.
    parser.set_defaults(web_host=LOOPBACK, master_bind_host=LOOPBACK)
    group = parser.add_argument_group("flash-sale burst")
    group.add_argument("--purchases", type=int, default=0, help="purchases in the whole sale (0: one per user)")
    group.add_argument("--scenario", choices=["spike", "closed"], default="spike")
    group.add_argument("--hosts", default="", help="comma-separated base URLs (pods); default --host")
    group.add_argument("--sku", default="flash-burst", help="the product on sale")
    group.add_argument(
        "--path",
        default="/api/products/{sku}/purchase",
        help="where purchases are posted; several, comma-separated: one round each, in order",
    )
    group.add_argument("--prepare-path", default="/api/session", help="the GET that sets a shopper's cookies")
    group.add_argument(
        "--wait-for", default="", help="master: hand out the shares only once this file exists (the pods are up)"
    )
    group.add_argument("--quantity", type=int, default=1, help="units per purchase")
    group.add_argument("--max-retries", type=int, default=3, help="resends of one purchase (busy, no answer)")
    group.add_argument("--countdown", type=float, default=1.0, help="seconds from every shopper ready to the opening")
    group.add_argument("--summary-json", default="", help="master: write the sale's figures here at the end")
    group.add_argument("--progress-file", default="", help="master: rewrite the progress here while running")


def write_json(path: str, data: dict) -> None:
    """Replace ``path`` atomically, so a reader never sees half a file."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def is_master(environment) -> bool:
    """This process conducts the sale: Locust's master, or the lone process (which is both)."""
    return not isinstance(environment.runner, WorkerRunner)


def is_worker(environment) -> bool:
    """This process shops: a Locust worker, or the lone process (which is both)."""
    return not isinstance(environment.runner, MasterRunner)


def round_paths(options) -> list[str]:
    return [path.strip() for path in options.path.split(",") if path.strip()]


def check_options(options) -> None:
    """Master: refuse a count, quantity, resend bound or countdown below its least (or nan or infinite),
    a quantity past the shop's MAX_QUANTITY, and a --path naming no endpoint, in one line."""
    numbers = (
        ("--purchases", options.purchases, 0),
        ("--quantity", options.quantity, 1),
        ("--max-retries", options.max_retries, 0),
        ("--countdown", options.countdown, 0),
    )
    for flag, value, least in numbers:
        if not math.isfinite(value):  # nan compares False with anything: it reached gevent.spawn_later
            raise SystemExit(f"{flag} must be a finite number, {least} or more, not {value:g}")
        if value < least:
            raise SystemExit(f"{flag} must be {least} or more, not {value:g}")
    if options.quantity > MAX_QUANTITY:  # the shop would answer every purchase 400
        raise SystemExit(f"--quantity must be at most {MAX_QUANTITY} (the shop's MAX_QUANTITY), not {options.quantity}")
    if not round_paths(options):
        raise SystemExit("--path must name at least one endpoint")


class FlashSale:
    """The sale in this Locust process, as Locust's plugins are written: one object that holds the
    state and whose methods are registered on Locust's events. A master holds the
    :class:`Conductor`, a worker its :class:`Sale`, the lone process both."""

    def __init__(self, events) -> None:
        self.environment = None  # Locust's Environment, for the events Locust fires without it
        self.sale: Sale | None = None  # this worker's share (or the lone process's)
        self.conductor: Conductor | None = None  # the master's view (or the lone process's)
        #: Master: the workers whose Locust stats came from a stopped worker (complete: it sends no more).
        self.stopped_workers: set[str] = set()
        self.quit_done: gevent.event.Event | None = None  # set once quit_once_reported has written the tables
        events.init_command_line_parser.add_listener(add_arguments)
        events.init.add_listener(self.on_init)
        events.test_start.add_listener(self.on_test_start)
        events.test_stop.add_listener(self.on_test_stop)
        events.worker_report.add_listener(self.on_worker_report)
        events.report_to_master.add_listener(self.on_report_to_master)
        events.user_error.add_listener(self.on_user_error)
        #: Between processes, messages are Locust's custom messages; the lone process calls these itself.
        self.to_master = {messages.USERS: self.on_users, messages.READY: self.on_ready, messages.REPORT: self.on_report}
        self.to_workers = {messages.SHARE: self.on_share, messages.OPEN: self.on_open}

    def on_init(self, environment, **kwargs) -> None:
        self.environment = environment
        if environment.parsed_options is not None and is_master(environment):
            check_options(environment.parsed_options)
        runner = environment.runner
        handlers = self.to_master if isinstance(runner, MasterRunner) else self.to_workers
        if isinstance(runner, (MasterRunner, WorkerRunner)):
            for kind, handler in handlers.items():
                runner.register_message(kind, handler)
        options = environment.parsed_options
        if isinstance(runner, MasterRunner) and options is not None and options.headless:
            await_workers(runner, options.expect_workers)
        if kwargs.get("web_ui") is not None:  # a sale stops the runner itself: see loadtests/webui.py
            hold_passing_polls(kwargs["web_ui"], runner)

    def on_test_start(self, environment, **kwargs) -> None:
        rounds = len(round_paths(environment.parsed_options))
        if is_worker(environment):
            self.sale = Sale(rounds=rounds)
            self.sale.on_round_end = lambda ended: self.end_round(environment, ended)
        if is_master(environment):
            self.conductor = Conductor(purchases=environment.parsed_options.purchases, rounds=rounds)
            gevent.spawn(self.follow, environment, self.conductor)

    def follow(self, environment, mine: Conductor) -> None:
        """Master: rewrite the progress file; the lone process also takes its own reports here."""
        options = environment.parsed_options
        while mine is self.conductor and mine.phase != "ended":
            if not mine.shared and mine.users:
                self.hand_out(environment)
            if is_worker(environment) and self.sale is not None:
                self.absorb(environment, LOCAL, self.sale.report())
            if options.progress_file:
                write_json(options.progress_file, mine.progress())
            gevent.sleep(PROGRESS_INTERVAL_S)

    def tell_master(self, environment, kind: str, data: dict) -> None:
        if isinstance(environment.runner, WorkerRunner):
            environment.runner.send_message(kind, data)
        else:
            self.to_master[kind](environment, SimpleNamespace(data=data, node_id=LOCAL))

    def tell_workers(self, environment, kind: str, data: dict, worker: str | None = None) -> None:
        """To ``worker``, or to every worker at once (one broadcast message)."""
        if isinstance(environment.runner, MasterRunner):
            environment.runner.send_message(kind, data, client_id=worker)
        else:
            self.to_workers[kind](environment, SimpleNamespace(data=data, node_id=LOCAL))

    def on_users(self, environment, msg) -> None:
        """Master: a worker's user count; once all are in (and ``--wait-for`` exists), every worker's share."""
        runner = environment.runner
        index = runner.get_worker_index(msg.node_id) if isinstance(runner, MasterRunner) else 0
        self.conductor.count_users(msg.node_id, index=index, users=msg.data["users"])
        self.hand_out(environment)

    def hand_out(self, environment) -> None:
        """Master: every worker's share, once the user counts add up and the pods may be shopped."""
        wait_for = environment.parsed_options.wait_for
        if wait_for and not os.path.exists(wait_for):
            return  # follow() tries again every PROGRESS_INTERVAL_S
        for worker, share in self.conductor.shares(environment.runner.target_user_count).items():
            self.tell_workers(environment, messages.SHARE, share, worker)

    def on_ready(self, environment, msg) -> None:
        """Master: a worker has built its shoppers' requests for a round; the last one starts the countdown."""
        conductor = self.conductor
        conductor.absorb(msg.node_id, msg.data)
        wait_s = self.countdown_s(environment)
        if conductor.mark_ready(msg.node_id, opens_at=time.time() + wait_s, round=msg.data["round"]):
            gevent.spawn_later(wait_s, self.open_sale, environment, conductor)

    def countdown_s(self, environment) -> float:
        """The first round waits the countdown; later ones open as soon as all are ready (and a moment
        for the pods to finish logging the previous round)."""
        return environment.parsed_options.countdown if self.conductor.round == 0 else ROUND_PAUSE_S

    def on_report(self, environment, msg) -> None:
        """Master: a worker's last report of a round (sent before it starts the next)."""
        self.absorb(environment, msg.node_id, msg.data)

    def open_sale(self, environment, mine: Conductor) -> None:
        if mine is self.conductor:
            mine.open(time.time())
            self.tell_workers(environment, messages.OPEN, {"round": mine.round})

    def on_worker_report(self, client_id: str, data: dict) -> None:
        if data.get("stopped"):
            self.stopped_workers.add(client_id)
        if self.conductor is not None and "flashsale" in data:
            self.absorb(self.environment, client_id, data["flashsale"])

    def absorb(self, environment, worker: str, report: dict) -> None:
        """Master: keep a worker's report; once every worker has finished the round, the next round
        (its countdown starts if every worker is ready for it already), or the summary and the end."""
        conductor = self.conductor
        conductor.absorb(worker, report)
        if not conductor.finished or conductor.phase == "ended":
            return
        try:
            self.close_round(environment, conductor)
        except Exception:
            # A round that cannot be closed would leave the sale waiting until flashsale's time limit:
            # quit now, without a summary; flashsale then says so with the end of this log.
            logging.exception("the master could not close round %s", conductor.round)
            gevent.spawn(environment.runner.quit)

    def close_round(self, environment, conductor: Conductor) -> None:
        """Every worker has finished the round: the next round, or the summary and the end."""
        if conductor.errors:
            self.end_sale(environment)
            return
        conductor.next_round()
        if conductor.phase == "ended":
            self.end_sale(environment)
        elif conductor.count_down(time.time() + ROUND_PAUSE_S):
            gevent.spawn_later(ROUND_PAUSE_S, self.open_sale, environment, conductor)

    def end_sale(self, environment) -> None:
        options = environment.parsed_options
        summary = self.conductor.sale_summary()
        self.conductor.phase = "ended"
        if options.summary_json:
            write_json(options.summary_json, summary)
        if options.progress_file:
            write_json(options.progress_file, self.conductor.progress())
        runner = environment.runner
        if isinstance(runner, MasterRunner) and options.headless:
            runner.quit = self.quit_once_reported  # Locust's shutdown calls it too
        gevent.spawn(runner.quit if options.headless else runner.stop)

    def quit_once_reported(self) -> None:
        """A headless master's quit once the sale has ended, in place of ``MasterRunner.quit``.
        Locust's sends every worker ``quit``, then sleeps 0.5 s for their last stats whether or not
        they came, and its shutdown calls it a second time: each row's master left about 1.1 s after
        the sale's last answer, and ``flashsale`` waits for it. This waits until every worker's stats
        have come from a stopped worker (the one each sends on ``quit``), at most ``QUIT_WAIT_S``,
        writes ``--csv``'s tables from them, and only then lets the runner end. Later calls (a
        worker's leaving, the shutdown) wait for the first."""
        runner = self.environment.runner
        if self.quit_done is None:
            self.quit_done = gevent.event.Event()
            workers = {client.id for client in runner.clients.all}
            runner.stop(send_stop_to_client=False)
            for worker in workers:
                runner.server.send_to_client(Message("quit", None, worker))
            deadline = time.monotonic() + QUIT_WAIT_S
            while not workers <= self.stopped_workers and time.monotonic() < deadline:
                gevent.sleep(0.005)
            write_final_csv(self.environment)
            self.quit_done.set()
        self.quit_done.wait(QUIT_WAIT_S + 1.0)
        runner.greenlet.kill(block=True)

    def on_test_stop(self, environment, **kwargs) -> None:
        """Master: the run ended before the sale did (``-t``, Ctrl-C, stop in the UI): say what was seen."""
        conductor = self.conductor
        if is_master(environment) and conductor is not None and conductor.phase != "ended":
            summary = conductor.sale_summary()
            conductor.phase = "ended"
            if environment.parsed_options.summary_json:
                write_json(environment.parsed_options.summary_json, summary)

    def on_report_to_master(self, client_id: str, data: dict) -> None:
        if self.sale is not None:
            data["flashsale"] = self.sale.report()
        # A stopped worker makes no more requests: these stats are its last (quit_once_reported).
        data["stopped"] = self.environment.runner.state == STATE_STOPPED

    def on_share(self, environment, msg) -> None:
        """Worker: the master's share for this worker's users."""
        self.sale.take_share(**msg.data)
        self.tell_ready(environment, 0)

    def tell_ready(self, environment, number: int) -> None:
        sale = self.sale
        if sale.ready_for(number) and number not in sale.ready_told:
            sale.ready_told.add(number)
            sale.phase = "ready"
            self.tell_master(environment, messages.READY, {**sale.report(), "round": number})

    def end_round(self, environment, ended: Sale) -> None:
        """Worker: every purchase of this round is answered: its last report, then the next round's figures."""
        self.tell_master(environment, messages.REPORT, ended.report(whole=True))
        if ended.round + 1 < ended.rounds:
            ended.start_round(ended.round + 1)

    def on_open(self, environment, msg) -> None:
        """Worker: the gate of a round opens.

        The spike's purchases are written here, one after the other without yielding to gevent's
        hub (a small write to an idle connection does not block), so no answer that comes back
        meanwhile is parsed between two sends. Each shopper then reads its own answer.
        """
        number, sale = msg.data.get("round", 0), self.sale
        if sale is None or not sale.shared.is_set() or number >= sale.rounds or sale.gates[number].is_set():
            return
        sale.phase = "open"
        for shopper, request in sale.opening[number]:
            shopper.first_send = shopper.send_now(request)
        sale.gates[number].set()

    def on_user_error(self, user_instance, exception, tb, **kwargs) -> None:
        """A bug in a shopper's code (not an answer of the shop): the sale is void; the master stops it."""
        self.sale.errors.append(f"{type(exception).__name__}: {exception}")


flash_sale = FlashSale(events)


class Shopper(User):
    """Prepares its shoppers over its own connection, waits at the gate, buys for each."""

    wait_time = constant(0)

    def __init__(self, environment) -> None:
        super().__init__(environment)
        self.sale = flash_sale.sale  # made at test_start, before Locust spawns a user
        self.index = self.sale.next_user
        self.sale.next_user += 1
        self.connection: Connection | None = None
        self.first_send: float | BaseException | None = None  # set at the opening in the spike
        users = environment.runner.target_user_count
        if self.sale.next_user == users and users != self.sale.users_announced:
            self.sale.users_announced = users
            flash_sale.tell_master(environment, messages.USERS, {"users": users})

    def on_stop(self) -> None:
        if self.connection is not None:
            self.connection.close()

    @task
    def shop(self) -> None:
        options = self.environment.parsed_options
        self.sale.shared.wait()
        hosts = [host for host in options.hosts.split(",") if host] or [self.environment.host]
        self.connection = Connection(hosts, self.sale.offset + self.index)
        shoppers = [self.prepare(options) for _ in range(self.sale.shoppers_of(self.index))]
        shoppers = [cookies for cookies in shoppers if cookies is not None]
        for number, path in enumerate(round_paths(options)):
            requests = [self.purchase_request(options, path, cookies) for cookies in shoppers]
            own = requests[:1] if options.scenario == "spike" else []  # written at the opening
            if own:
                self.sale.opening[number].append((self, own[0]))
            self.sale.queue(number, requests[len(own) :])
            self.sale.arm(number, len(requests))
            flash_sale.tell_ready(self.environment, number)
            self.sale.gates[number].wait()
            for request in own:
                self.purchase(options, request, sent=self.first_send)
                self.first_send = None
            # Then the worker's unsent purchases, whoever built them, until none is left (loadtests/sale.py).
            while (request := self.sale.next_purchase(number)) is not None:
                self.purchase(options, request)
        raise StopUser()

    def send_now(self, request: bytes) -> float | OSError:
        """Write ``request``: the wall-clock time it was fully handed to the kernel, or the error."""
        try:
            self.connection.send(request)
        except OSError as exc:
            self.connection.close()
            return exc
        return time.time()

    def exchange(
        self, name: str, method: str, request: bytes, sent: float | BaseException | None = None
    ) -> tuple[int, Headers | None, bytes, float]:
        """Send (unless ``sent`` says it was sent, or failed to be), read the answer, report it to
        Locust: (status or 0, headers, body, seconds sent at)."""
        started = time.perf_counter()
        sent_at = None
        try:
            if sent is None:
                sent = self.send_now(request)
            if isinstance(sent, BaseException):
                raise sent
            sent_at = sent
            status, headers, body = self.connection.receive(method)
            error = None if status in (200, 201, 409, 503) else f"answered {status}"
        except (OSError, HTTPParseError) as exc:
            self.connection.close()
            status, headers, body, error = 0, None, b"", exc
        self.environment.events.request.fire(
            request_type=method,
            name=name,
            response_time=(time.perf_counter() - started) * 1000,
            response_length=len(body),
            exception=error,
            context={},
        )
        return status, headers, body, sent_at if sent_at is not None else time.time()

    def prepare(self, options) -> dict[str, str] | None:
        """A new shopper: its cookies (session and CSRF), or None if preparing it kept failing."""
        page = self.connection.request("GET", options.prepare_path.format(sku=options.sku), {"Accept": "*/*"})
        for attempt in range(PAGE_ATTEMPTS):
            status, headers, _, _ = self.exchange(PAGE_NAME, "GET", page)
            pairs = (cookie.split(";", 1)[0].strip() for cookie in (headers.getlist("set-cookie") if headers else []))
            cookies = dict(pair.split("=", 1) for pair in pairs if "=" in pair)
            if status == 200 and "csrftoken" in cookies:
                self.sale.prepared += 1
                return cookies
            gevent.sleep(0.1 * (attempt + 1))
        self.sale.page_failures += 1
        return None

    def purchase_request(self, options, path: str, cookies: dict[str, str]) -> bytes:
        """A prepared shopper's purchase for one round, under a new Idempotency-Key."""
        return self.connection.request(
            "POST",
            path.format(sku=options.sku),
            {
                "Content-Type": "application/json",
                "X-CSRFToken": cookies["csrftoken"],
                "Cookie": "; ".join(f"{name}={value}" for name, value in cookies.items()),
                "Idempotency-Key": secrets.token_urlsafe(16),
            },
            json.dumps({"quantity": options.quantity}).encode(),
        )

    def purchase(self, options, request: bytes, *, sent: float | BaseException | None = None) -> None:
        """Send one purchase (or read the answer to one ``sent`` at the opening); resend it with
        the same Idempotency-Key after a 503 + Retry-After, no answer or a balancer's 502, at
        most --max-retries times in all."""
        self.sale.sent += 1
        started = None
        busy_at, reset_at = [], []
        for attempt in range(options.max_retries + 1):
            already = sent if attempt == 0 else None
            status, headers, body, sent_at = self.exchange(PURCHASE_NAME, "POST", request, already)
            if started is None:
                started = sent_at
                self.sale.note_sent(sent_at)
            if headers and headers.get(ANSWERED_BY) == "balancer":
                self.sale.balancer_answers += 1
            retry_after = retry_after_s(headers.get("Retry-After")) if status == 503 and headers else None
            if retry_after is not None:
                busy_at.append(round(time.time(), 4))
            failed = status in (0, BAD_GATEWAY)
            if (retry_after is None and not failed) or attempt == options.max_retries:
                break
            if failed:
                reset_at.append(round(time.time(), 4))
                self.sale.transport_resends += 1
                self.connection.fail_over()  # a new connection, to the next host
                gevent.sleep(RESEND_WAIT_S * attempt)  # the first resend at once, later ones back off
            else:
                self.sale.client_retries += 1
                gevent.sleep(min(retry_after, MAX_RETRY_WAIT_S))
        busy = retry_after is not None
        self.sale.record(status, headers, body, busy=busy, started=started, busy_at=busy_at, reset_at=reset_at)


#: The longest a master's quit waits for its workers' last stats; it goes on as soon as they are in.
#: Locust's own quit always waits 0.5 s, which a loaded machine's workers outlasted.
QUIT_WAIT_S = 3.0


def write_final_csv(environment) -> None:
    """``--csv``'s three tables written once more from the final stats. Locust rewrites them every
    second and not at its end, so the last second of a sale could be missing from them (seen:
    5,931 of 6,000 purchases in a ``_stats.csv`` whose HTML report counted 6,000)."""
    prefix = environment.parsed_options.csv_prefix
    if not prefix:
        return
    tables = locust.stats.StatsCSV(environment, locust.stats.PERCENTILES_TO_REPORT)
    for suffix, write in (
        ("stats", tables.requests_csv),
        ("failures", tables.failures_csv),
        ("exceptions", tables.exceptions_csv),
    ):
        with open(f"{prefix}_{suffix}.csv", "w", newline="") as out:
            write(csv.writer(out))


#: How long a master waits in :func:`await_workers` before leaving the rest of the wait to Locust.
WORKERS_WAIT_S = 10.0


def await_workers(runner: MasterRunner, expected: int) -> None:
    """A headless master, at ``init``: wait, letting the runner's greenlets take the workers'
    greetings, until ``expected`` workers are ready. Locust's own wait for ``--expect-workers``
    checks once before any greeting can have come in and then sleeps a whole second between checks,
    so every sale started about a second after its workers were ready; once they are here its first
    check passes. (With the web UI nothing waits for workers at start: neither does this.)"""
    deadline = time.monotonic() + WORKERS_WAIT_S
    while len(runner.clients.ready) < expected and time.monotonic() < deadline:
        gevent.sleep(0.02)
