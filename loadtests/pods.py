"""The processes of one burst row: the pods' environment and gunicorn instances, HAProxy in front
of them (``--balancer haproxy``), the Locust master and workers that shop them, the files the
master reports through, and the PostgreSQL connection sampler."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from pathlib import Path
from urllib.parse import quote, urlencode, urlsplit

import django
import psycopg
from django.conf import settings
from django.contrib.staticfiles import finders
from django.contrib.staticfiles.storage import ManifestFilesMixin
from django.db import connection

from inventory.strategies import strategy_class
from processes.children import Child, ChildError, listening_socket, stop_all, wait_until_answers
from shop.settings import STATIC_ROOT as SHOP_STATIC_ROOT  # where the collect subprocess writes
from shop.static_lock import static_files

from .balancer import INHERITED_BIND, BalancerError, frontend_maxconn, haproxy_config, start_haproxy
from .plan import FLOOR, BurstError, BurstPlan

LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
CONNECTION_SAMPLE_INTERVAL_S = 0.05
#: The pods run at a lower CPU priority than Locust: on one machine they share the
#: cores, and a server that takes the CPU from its own load generator slows the spike it is measured
#: by. On separate machines (as in production) the two never compete; this approximates that.
POD_NICE = 5
#: Requests HAProxy lets each pod hold at once, per thread (measured: see docs/distributed.md).
HAPROXY_POD_QUEUE = 4
#: How long a pod started again (kill-pod) waits for its port: the killed pod's workers, SIGKILLed
#: with their master, let go of its socket as they die, a few milliseconds later.
REBIND_S = 5.0


def database_url() -> str:
    """A ``DATABASE_URL`` for the database this process is connected to (``test_…`` under pytest)."""
    db = connection.settings_dict
    credentials = quote(db.get("USER") or "", safe="")
    if db.get("PASSWORD"):
        credentials += ":" + quote(db["PASSWORD"], safe="")
    host = db.get("HOST") or ""
    if db.get("PORT"):
        host += f":{db['PORT']}"
    url = f"postgres://{credentials}{'@' if credentials else ''}{host}/{quote(db['NAME'], safe='')}"
    options = {
        k: v for k, v in (db.get("OPTIONS") or {}).items() if isinstance(v, (str, int)) and not isinstance(v, bool)
    }
    return f"{url}?{urlencode(options)}" if options else url


def server_environment(
    *, backend: str, plan: BurstPlan, access_log: Path, overrides: dict[str, str] | None = None
) -> dict[str, str]:
    """One pod's environment: this process's services, the strategy, the sizing of its workers;
    ``overrides`` last (a fault's private Redis, its shorter lease, the storage check off). Where it
    listens :func:`start_gunicorn` adds."""
    inventory = settings.INVENTORY
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"ALLOW_UNSAFE_STRATEGY", "ALLOW_UNSAFE_BACKEND", "DATABASE_CONN_MAX_AGE"}
    }
    env["INVENTORY_FENCED"] = "1" if inventory["OPTIONS"]["FENCED"] else "0"
    env["INVENTORY_BATCH"] = str(plan.batch)
    env["INVENTORY_QUEUE"] = plan.queue
    env.update(
        DJANGO_SETTINGS_MODULE="shop.settings",
        SHOP_SERVER=plan.server,
        DATABASE_URL=database_url(),
        DATABASE_POOL_MAX_SIZE=str(plan.pool_max_size),
        DATABASE_POOL_TIMEOUT=str(plan.pool_timeout_s),
        REDIS_URL=inventory["REDIS_URL"],
        REDLOCK_URLS=",".join(inventory["REDLOCK_URLS"]),
        REDLOCK_BASE_PORT=str(settings.REDLOCK_BASE_PORT),
        LOCK_TTL_MS=str(inventory["LOCK_TTL_MS"]),
        ACQUIRE_TIMEOUT_MS=str(inventory["ACQUIRE_TIMEOUT_MS"]),
        # The floor touches no strategy; any valid one lets the shop start.
        INVENTORY_STRATEGY="db" if backend == FLOOR else backend,
        GUNICORN_WORKERS=str(plan.workers),
        GUNICORN_THREADS=str(plan.threads),
        # Every prepared shopper's connection stays open through preparation and countdown.
        GUNICORN_KEEPALIVE=str(int(keepalive_s(plan))),
        GUNICORN_WORKER_CONNECTIONS=str(plan.requests + plan.threads + 16),
        GUNICORN_BACKLOG=str(pod_backlog(plan)),
        # The server's own count of purchase POSTs, to check Locust's against.
        GUNICORN_ACCESSLOG=str(access_log),
    )
    if backend != FLOOR:
        env.update(strategy_class(backend).server_env(inventory))
    env.update(overrides or {})
    return env


def pod_backlog(plan: BurstPlan) -> int:
    """A pod's listen queue: every shopper of the spike may connect at once."""
    return max(2048, plan.requests)


def start_gunicorn(
    name: str, sock: socket.socket, *, env: dict[str, str], log_path: Path, nice: int = 0, append: bool = False
) -> Child:
    """A pod's gunicorn (``env``: :func:`server_environment`'s), started on ``sock``, a socket
    listening since its port was chosen (:func:`processes.children.listening_socket`): gunicorn
    inherits it (``GUNICORN_BIND=fd://N``), so no other process can take the port between its
    choice and gunicorn's start. This process's copy is closed once gunicorn has started (or failed
    to): a pod stopped later lets go of its port, as a dead server does."""
    try:
        child = Child(
            name,
            [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py"],
            cwd=settings.BASE_DIR,
            env={**env, "GUNICORN_BIND": f"fd://{sock.fileno()}"},
            log_path=log_path,
            nice=nice,
            append=append,
            pass_fds=(sock.fileno(),),
        )
        child.start()
    finally:
        sock.close()
    return child


#: Left in the collected folder by a collect: the fingerprint of the sources it collected.
COLLECTED_MARK = ".collected-from"


def collect_static(*, force: bool = False) -> bool:
    """Collect static files the way gunicorn will serve them, unless the last collect into the
    folder was of these very sources (``force``: collect anyway). Returns whether it collected.

    gunicorn runs with DEBUG off, where the manifest storage refuses to render a page whose
    stylesheet was never collected (every product page would be a 500). One collect at a time per
    checkout, and not while a server starts (:mod:`shop.static_lock`). A collect hashes and
    compresses every file again (5.6 s on the twelfth session's machine, once per ``flashsale`` run),
    so it is skipped when the folder holds a manifest and the fingerprint its last collect left
    (:func:`static_sources_fingerprint`) matches the sources now: an edited, added or removed source
    file, or a folder emptied by hand, collects again.
    """
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "shop.settings",
        "DJANGO_DEBUG": "0",
        "DATABASE_URL": database_url(),
    }
    mark = Path(SHOP_STATIC_ROOT) / COLLECTED_MARK
    with static_files(writing=True):
        fingerprint = static_sources_fingerprint()
        if not force and _collected(mark, fingerprint):
            return False
        mark.unlink(missing_ok=True)
        result = subprocess.run(
            [sys.executable, "manage.py", "collectstatic", "--noinput", "--verbosity", "0"],
            cwd=settings.BASE_DIR,
            env=env,
            capture_output=True,
            text=True,
        )
        if result.returncode == 0:
            mark.write_text(fingerprint)
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines()
        raise BurstError(f"collectstatic failed: {lines[-1] if lines else result.returncode}")
    return True


def _collected(mark: Path, fingerprint: str) -> bool:
    """Whether the folder's last collect was of the sources ``fingerprint`` names, and finished."""
    try:
        return mark.read_text() == fingerprint and (mark.parent / ManifestFilesMixin.manifest_name).is_file()
    except OSError:
        return False


def static_sources_fingerprint() -> str:
    """A digest of every file the static-file finders see (its path, size and modification time)
    and of the versions of Django and WhiteNoise, whose storage hashes and compresses them."""
    digest = hashlib.sha256(f"django {django.get_version()} whitenoise {version('whitenoise')}\n".encode())
    listed = []
    for finder in finders.get_finders():
        for path, storage in finder.list([]):
            stat = os.stat(storage.path(path))
            listed.append(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}")
    for entry in sorted(listed):
        digest.update(entry.encode() + b"\n")
    return digest.hexdigest()


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class ConnectionSampler(threading.Thread):
    """The most connections to the run's database seen at once (``pg_stat_activity``, every 50 ms),
    the runner's own included, the sampler's not."""

    QUERY = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"

    def __init__(self, url: str) -> None:
        super().__init__(name="pg-connection-sampler", daemon=True)
        self.url = url
        self.peak = 0
        self.error: str | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
                while True:
                    self.peak = max(self.peak, conn.execute(self.QUERY).fetchone()[0])
                    if self._stop_event.wait(CONNECTION_SAMPLE_INTERVAL_S):
                        return
        except psycopg.Error as exc:
            self.error = str(exc).strip()

    def stop(self) -> int | None:
        self._stop_event.set()
        self.join(5)
        return None if self.error else self.peak


class Row:
    """The processes and files of one row while it runs: pods, the balancer, the Locust master and workers."""

    def __init__(
        self,
        *,
        backend: str,
        plan: BurstPlan,
        run_dir: Path,
        scratch: Path,
        env: dict[str, str] | None = None,
        rounds: list[tuple[str, str]] | None = None,
    ) -> None:
        self.backend = backend
        # (endpoint, SKU) of each round, in order
        self.rounds = rounds or [("floor" if backend == FLOOR else "purchase", plan.sku)]
        self.env = env or {}
        self.plan = plan
        self.run_dir = run_dir
        self.scratch = scratch
        self.pods: list[Child | None] = []
        self.ports: list[int] = []
        # Each pod's listening socket from the choice of its port until its gunicorn has it.
        self.sockets: list[socket.socket | None] = []
        self.balancer: Child | None = None
        self.balancer_port: int | None = None
        # The balancer's listening socket from the choice of its port until HAProxy has it.
        self.balancer_socket: socket.socket | None = None
        self.master: Child | None = None
        self.workers: list[Child] = []
        self.summary_path = scratch / "summary.json"
        self.go_path = scratch / "go"
        self.progress_path = scratch / "progress.json"
        self.locust_report = run_dir / "locust" / f"{backend}-{time.strftime('%Y%m%d-%H%M%S')}"

    def access_log(self, pod: int) -> Path:
        return self.run_dir / f"{self.backend}-pod{pod}-access.log"

    def reserve_ports(self) -> None:
        """The pods' (and the balancer's) ports, chosen before anything starts: Locust is started
        with them while the pods boot, and waits for :meth:`go` before it prepares any shopper.
        Each port is a socket listening from now on, which its pod's gunicorn (the balancer's
        HAProxy) takes over: no other process can take the port meanwhile, and what answers there
        is the pod (the balancer)."""
        self.close_sockets()
        self.sockets = [listening_socket(backlog=pod_backlog(self.plan)) for _ in range(self.plan.pods)]
        self.ports = [sock.getsockname()[1] for sock in self.sockets]
        if self.plan.balancer == "haproxy":
            self.balancer_socket = listening_socket(backlog=frontend_maxconn(self.balancer_connections))
            self.balancer_port = self.balancer_socket.getsockname()[1]

    def go(self) -> None:
        """The pods are up and warm: the Locust master may hand out the shares (``--wait-for``)."""
        self.go_path.touch()

    def start_pods(self) -> None:
        if not self.ports:
            self.reserve_ports()
        for pod in range(self.plan.pods):
            self.access_log(pod).unlink(missing_ok=True)
            self.pods.append(self.start_pod(pod))
        for pod in range(self.plan.pods):
            self.wait_for_pod(pod)
        if self.plan.balancer == "haproxy":
            self.start_balancer()

    def start_pod(self, pod: int) -> Child:
        """Pod ``pod`` on its port, started (again, after a kill: its access log is appended to).
        Its gunicorn inherits the port's listening socket (``fd://N``): the one :meth:`reserve_ports`
        holds, or after a kill one bound again here, a ChildError if another process took the port."""
        sock = self.sockets[pod] if pod < len(self.sockets) else None
        if sock is None:
            sock = self.rebind(pod)
        env = server_environment(
            backend=self.backend, plan=self.plan, access_log=self.access_log(pod), overrides=self.env
        )
        if pod < len(self.sockets):
            self.sockets[pod] = None  # start_gunicorn closes this process's copy
        return start_gunicorn(
            f"gunicorn pod {pod}",
            sock,
            env=env,
            log_path=self.run_dir / f"{self.backend}-pod{pod}-gunicorn.log",
            nice=POD_NICE,
            append=True,
        )

    def rebind(self, pod: int) -> socket.socket:
        """Pod ``pod``'s port listening again, for its start after a kill."""
        port = self.ports[pod]
        deadline = time.monotonic() + REBIND_S
        while True:
            try:
                return listening_socket(port, backlog=pod_backlog(self.plan))
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise ChildError(
                        f"gunicorn pod {pod}: port {port} was taken by another process while the pod was down "
                        f"({exc.strerror or exc}); not started on it"
                    ) from exc
            time.sleep(0.02)

    def close_sockets(self) -> None:
        """Let go of the ports of pods (and a balancer) that never started."""
        for sock in [*self.sockets, self.balancer_socket]:
            if sock is not None:
                sock.close()
        self.sockets = []
        self.balancer_socket = None

    def wait_for_pod(self, pod: int) -> None:
        wait_until_answers(self.pods[pod], f"http://127.0.0.1:{self.ports[pod]}{self.health_path}")

    @property
    def health_path(self) -> str:
        return f"/api/products/{self.plan.sku}"

    @property
    def balancer_connections(self) -> int:
        """Client connections the balancer takes at once: every shopper's, and a few more."""
        return (self.plan.requests if self.plan.scenario == "spike" else self.plan.users) + 16

    def start_balancer(self) -> None:
        """HAProxy in front of the pods, on the socket :meth:`reserve_ports` listens on (``bind fd@N``)."""
        plan = self.plan
        if self.balancer_socket is None:
            raise BurstError("the balancer's port was not reserved (reserve_ports), or HAProxy was started already")
        sock, self.balancer_socket = self.balancer_socket, None
        config = haproxy_config(
            bind=INHERITED_BIND,
            pods=self.ports,
            health_path=self.health_path,
            connections=self.balancer_connections,
            per_pod=plan.workers * plan.threads * HAPROXY_POD_QUEUE,
            idle_s=keepalive_s(plan),
        )
        try:
            self.balancer = start_haproxy(
                config=config, run_dir=self.run_dir, name=self.backend, cwd=settings.BASE_DIR, listening=sock
            )
        except BalancerError as exc:
            raise BurstError(str(exc)) from exc
        wait_until_answers(self.balancer, f"{self.hosts[0]}{self.health_path}")

    @property
    def hosts(self) -> list[str]:
        """Where the shoppers go: the balancer, or every pod."""
        if self.balancer_port is not None:
            return [f"http://127.0.0.1:{self.balancer_port}"]
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    def start_locusts(self) -> None:
        """One Locust master and ``plan.locust_workers`` workers (``loadtests/locustfile.py``)."""
        wait_for_lingering_masters()
        plan = self.plan
        closed = plan.scenario != "spike"
        users = max(1, min(plan.users if closed else plan.requests, plan.requests))
        env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
        env["PYTHONPATH"] = str(settings.BASE_DIR)
        locust = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--loglevel", "WARNING"]
        self.locust_report.parent.mkdir(parents=True, exist_ok=True)
        self.master = Child(
            "locust master",
            [
                *locust,
                *("--master", "--headless", "--only-summary", "--expect-workers", str(plan.locust_workers)),
                *("--master-bind-host", "127.0.0.1", "--master-bind-port", str(plan.master_port)),
                *("--host", self.hosts[0], "--hosts", ",".join(self.hosts)),
                *("-u", str(users), "-r", str(users), "-t", f"{int(keepalive_s(plan))}s"),
                *("--scenario", "closed" if closed else "spike", "--purchases", str(plan.requests)),
                *("--sku", plan.sku, "--max-retries", str(plan.max_retries), "--countdown", str(plan.countdown_s)),
                *("--path", ",".join(f"/api/products/{sku}/{endpoint}" for endpoint, sku in self.rounds)),
                *("--summary-json", str(self.summary_path), "--progress-file", str(self.progress_path)),
                *("--wait-for", str(self.go_path)),
                *("--csv", str(self.locust_report), "--html", f"{self.locust_report}.html"),
            ],
            cwd=settings.BASE_DIR,
            env=env,
            log_path=self.run_dir / f"{self.backend}-locust-master.log",
        )
        self.master.start()
        for index in range(plan.locust_workers):
            self.workers.append(
                Child(
                    f"locust worker {index}",
                    [*locust, "--worker", "--master-host", "127.0.0.1", "--master-port", str(plan.master_port)],
                    cwd=settings.BASE_DIR,
                    env=env,
                    log_path=self.run_dir / f"{self.backend}-locust-worker{index}.log",
                )
            )
            self.workers[-1].start()

    def warm_up(self) -> None:
        """Before anything is measured: every pod answers a few hundred session and floor
        requests over a few dozen connections, so no worker serves its first request (imports,
        URL resolver, template and connection set-up) inside a measured round."""
        warm_up(self.hosts, sku=self.plan.sku, connections=WARM_UP_CONNECTIONS * self.plan.pods)

    def yardstick(self) -> dict:
        """The plain client (:mod:`loadtests.yardstick`) on the floor endpoint of these pods, as
        many shoppers as the row had: the figure the Locust floor round is read against."""
        result = subprocess.run(
            [sys.executable, "-m", "loadtests.yardstick", "--json", "--host", ",".join(self.hosts)]
            + ["--requests", str(self.plan.requests), "--path", f"/api/products/{self.plan.sku}/floor"],
            cwd=settings.BASE_DIR,
            capture_output=True,
            text=True,
            timeout=self.plan.timeout_s + 60,
        )
        if result.returncode != 0:
            raise BurstError(f"the yardstick failed: {(result.stderr or result.stdout).strip()[-300:]}")
        return json.loads(result.stdout)

    def progress_report(self) -> dict:
        """The master's progress file: phase, opened_at, prepared, sent, answered, limit."""
        return read_json(self.progress_path) or {}

    def answered(self) -> int:
        return self.progress_report().get("answered", 0)

    def first_pod_pid(self) -> int | None:
        return self.pods[0].process.pid if self.pods and self.pods[0] is not None else None

    def cpu_roots(self) -> dict[str, list[int]]:
        """The row's own process trees by group, for :func:`loadtests.cpu.snapshot`: its pods (a pod
        killed and started again by a fault counts from its restart) and its Locust processes."""
        locusts = [child for child in [self.master, *self.workers] if child is not None]
        return {
            "pods": [pod.process.pid for pod in self.pods if pod is not None and pod.process is not None],
            "locust": [child.process.pid for child in locusts if child.process is not None],
        }

    def stop(self) -> None:
        """Stop the row's processes together: the balancer, then the Locust workers (those of a sale
        that ended leave by themselves on the master's quit, their last stats sent; any other is
        SIGKILLed), then the pods (SIGTERM) and the master (after its own quit)."""
        stop_all([self.balancer])
        ended = self.summary_path.exists()
        if ended:
            # The sale ended and the master has sent every worker ``quit``: each stops, sends its last
            # stats and leaves. SIGKILLed at once, a worker starved of a core lost them, and Locust's
            # own CSV and HTML counted 738 or 861 of a spike's 1,200 purchases (the judged figures,
            # from the workers' sale reports, were whole).
            wait_for_exits(self.workers, WORKER_QUIT_S)  # 4-32 ms on a quiet machine
        stop_all(self.workers, signal.SIGKILL)  # any worker still there: the master has its reports
        # The pods stop gracefully: a gunicorn worker writes a request's access-log line after its
        # answer, and server_purchases counts those lines. Killed at once, a worker starved of a
        # core could lose its last ones (seen: 498 logged of 500 answered, a spike's invariants
        # judged broken). With Locust's connections gone the workers have nothing left to finish.
        stop_all(self.pods)
        self.close_sockets()
        # The master writes Locust's HTML and CSV reports as it quits (a few tenths of a second once
        # its workers' last stats are in, loadtests/locustfile.py's quit_once_reported; Locust's own
        # quit slept 1 s): the next row goes on meanwhile, and waits for it only before it starts its
        # own master on the same port.
        if self.master is not None:
            # A master whose sale ended (its summary is written) leaves by itself, its reports
            # complete; a SIGTERM meanwhile raced them (a fresh clone's run at load 8: no HTML page,
            # the CSV 1,043 of 1,200). Any other master is stopped at once.
            LINGERING.append(threading.Thread(target=let_quit, args=(self.master, ended), name="locust-master-stop"))
            LINGERING[-1].start()

    def server_purchases(self, endpoint: str, sku: str) -> int:
        """POSTs to ``endpoint`` (``purchase``, ``floor``) of ``sku`` that reached the pods, from their
        access logs (complete once they stopped)."""
        needle = f'"POST /api/products/{sku}/{endpoint} '
        total = 0
        for pod in range(len(self.pods)):
            try:
                with open(self.access_log(pod), errors="replace") as lines:
                    total += sum(needle in line for line in lines)
            except OSError:
                pass
        return total


class RestartablePod:
    """Pod ``index`` of a row as the kill-pod fault sees it: killed whole (SIGKILL to its gunicorn
    master and workers), then started again on its port with the same settings."""

    def __init__(self, row: Row, index: int) -> None:
        self.row, self.index = row, index

    def kill(self) -> None:
        self.row.pods[self.index].stop(signal.SIGKILL)

    def start(self) -> None:
        self.row.pods[self.index] = self.row.start_pod(self.index)
        self.row.wait_for_pod(self.index)


#: Locust masters of rows that have ended, still writing their reports as they quit.
LINGERING: list[threading.Thread] = []


#: How long a Locust master whose sale has ended gets to write its reports and leave by itself.
MASTER_QUIT_S = 10.0

#: How long a Locust worker whose sale has ended gets to send its last stats and leave on the master's quit.
WORKER_QUIT_S = 5.0


def wait_for_exits(children: list[Child], timeout_s: float) -> None:
    """Return once every one of ``children`` has exited, or ``timeout_s`` has passed."""
    deadline = time.monotonic() + timeout_s
    for child in children:
        if child.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(max(0.0, deadline - time.monotonic()))


def let_quit(master: Child, ended: bool) -> None:
    """Stop a row's Locust master: after its own quit when its sale ``ended``, else at once."""
    if ended:
        wait_for_exits([master], MASTER_QUIT_S)
    stop_all([master])


def wait_for_lingering_masters() -> None:
    """Return once every earlier row's Locust master has quit (it held the master port)."""
    while LINGERING:
        LINGERING.pop().join()


WARM_UP_CONNECTIONS, WARM_UP_REQUESTS = 16, 8


def warm_up(hosts: list[str], *, sku: str, connections: int) -> None:
    """``connections`` threads, each on its own keep-alive connection to one of ``hosts`` (round
    robin): a session, then ``WARM_UP_REQUESTS`` floor purchases. Errors are left to the measured rounds."""

    def one(index: int) -> None:
        url = urlsplit(hosts[index % len(hosts)])
        client = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
        try:
            client.request("GET", "/api/session")
            answer = client.getresponse()
            answer.read()
            cookies = [c.split(";", 1)[0] for c in answer.headers.get_all("Set-Cookie") or []]
            token = next((c.split("=", 1)[1] for c in cookies if c.startswith("csrftoken=")), "")
            headers = {"Content-Type": "application/json", "X-CSRFToken": token, "Cookie": "; ".join(cookies)}
            for _ in range(WARM_UP_REQUESTS):
                # The query string keeps these out of the rounds' access-log counts.
                client.request("POST", f"/api/products/{sku}/floor?warm-up", body=b'{"quantity": 1}', headers=headers)
                client.getresponse().read()
        except OSError:
            pass
        finally:
            client.close()

    with ThreadPoolExecutor(max_workers=connections) as pool:
        list(pool.map(one, range(connections)))


def keepalive_s(plan: BurstPlan) -> float:
    """How long a prepared connection may wait: preparing every shopper, the countdown, the burst."""
    return plan.prepare_timeout_s + plan.countdown_s + plan.timeout_s
