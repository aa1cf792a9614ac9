"""HAProxy in front of a row's pods, as a Kubernetes Service stands in front of pods.

:func:`haproxy_config` sizes it for a flash sale:

- ``maxconn`` (HAProxy raises its own file-descriptor limit to match) covers every shopper's
  connection at once, and the client and keep-alive timeouts cover preparing the shoppers and
  the countdown, so no prepared connection is closed before the opening;
- each pod takes at most ``workers × threads`` requests at a time (``maxconn`` per server), so a
  spike queues in HAProxy rather than in the pods' accept queues;
- HAProxy answers every request before the client gives up on it (:data:`HOLDS_AT_MOST_S` <
  the client's ``NETWORK_TIMEOUT_S``): a purchase queued past ``timeout queue`` gets HAProxy's
  busy answer (no pod saw it, so the client's keyed resend is safe), one a pod has not answered
  within ``timeout server`` a 504 (the pod may still commit it: the client does not resend). A
  client that gives up first resends while its purchase may still reach a pod, and the two race
  under one Idempotency-Key; ``option abortonclose`` drops a queued purchase whose client has
  gone (stopped, or still too impatient) instead of sending it to a pod after all;
- a health check GETs the product's API page every half second; a pod that fails two in a row
  gets no new requests until one succeeds. A dead pod fails at once (connection refused); a pod
  whose threads are all busy answers the check when one frees, so a check may take up to
  :data:`CHECK_TIMEOUT_S` (HAProxy's default, ``inter``, marked a saturated pod down, and with
  the other pod killed no pod was left). A connection a pod refuses marks it down at once
  (``observe layer4``), so a killed pod stops getting requests before its next check: with only
  the checks, the ~36 purchases sent to it in that half second came back as HAProxy's own 503s;
- with no pod up (or none it could connect to), HAProxy answers 503 with ``Retry-After`` itself
  (the shop's own busy answer) and ``X-Answered-By: balancer``: no pod logs that POST;
- HAProxy retries only a connection that failed to open, on another pod (``option
  redispatch``): it never resends a request a pod may have received, so a purchase POST reaches
  the pods once per client attempt and their access logs still add up.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

from processes.children import Child

#: Seconds a client is told to wait when no pod is up.
NO_POD_RETRY_AFTER_S = 1
HEALTH_INTERVAL_MS = 500
#: How long a health check may wait for a busy pod: a pod's threads are each held at most by one
#: purchase, whose wait for the lock is bounded by ACQUIRE_TIMEOUT_MS (5 s), plus its section.
CHECK_TIMEOUT_S = 6
#: A connection a pod refuses marks it down at once, before its next health check.
MARK_DOWN_ON_REFUSAL = "observe layer4 error-limit 1 on-error mark-down"
BUSY_BODY = '{"outcome": "busy", "detail": "no pod is up"}'
#: The header HAProxy's own answers carry (no pod saw the request), so clients can count them.
ANSWERED_BY = "X-Answered-By"
#: How long HAProxy holds one request at most: a connection attempt to a pod (``retries`` more on
#: another), the wait in the queue for a pod's free slot, the pod's answer. The queue's bound is the
#: larger: a spike of 5,000 purchases queues for seconds, and each purchase is bounded in the pod
#: by the lock's acquire timeout (5 s) and its section. Their sum stays under the client's 60 s.
CONNECT_TIMEOUT_S, CONNECT_RETRIES = 2, 2
QUEUE_TIMEOUT_S = 30
SERVER_TIMEOUT_S = 20
HOLDS_AT_MOST_S = CONNECT_TIMEOUT_S * (CONNECT_RETRIES + 1) + QUEUE_TIMEOUT_S + SERVER_TIMEOUT_S


class BalancerError(RuntimeError):
    """HAProxy is missing or refused its configuration."""


def haproxy_binary() -> str:
    found = shutil.which("haproxy") or (Path("/usr/sbin/haproxy").exists() and "/usr/sbin/haproxy")
    if not found:
        raise BalancerError("haproxy is not installed: run `make system` (Debian: apt-get install haproxy)")
    return found


#: The descriptor HAProxy gets its listening socket under, and its bind line. A low number: HAProxy
#: sizes its descriptor table by its ``maxconn`` and refuses one past it ("not enough free sockets"),
#: as a test worker's descriptor numbers had grown to be, for a balancer sized for a few connections.
LISTENING_FD = 3
INHERITED_BIND = f"fd@{LISTENING_FD}"


def frontend_maxconn(connections: int) -> int:
    """HAProxy's ``maxconn`` for ``connections`` clients at once, and the listen backlog of the socket
    it inherits: HAProxy would listen with its frontend's ``maxconn``, but keeps the backlog of a
    socket that already listens."""
    return connections + 64


def haproxy_config(
    *,
    bind: str,
    pods: list[int],
    health_path: str,
    connections: int,
    per_pod: int,
    idle_s: float,
    queue_s: float = QUEUE_TIMEOUT_S,
    server_s: float = SERVER_TIMEOUT_S,
) -> str:
    """HAProxy's configuration: listening on ``bind`` in front of the pods on ``pods`` (127.0.0.1).

    ``bind``: ``fd@N``, a listening socket HAProxy inherits open as file descriptor N (a burst row's,
    :func:`start_haproxy`'s ``listening``), or an address such as ``127.0.0.1:8080`` it binds itself.

    ``connections``: client connections at once; ``per_pod``: requests one pod serves at a time;
    ``idle_s``: how long a client connection may stay idle (preparing, countdown); ``queue_s``:
    how long a request may queue for a pod, ``server_s``: how long a pod may take to answer (with
    the defaults HAProxy answers before the client gives up).
    """
    idle = f"{int(idle_s * 1000)}ms"
    busy = (
        f"status 503 content-type application/json string '{BUSY_BODY}' "
        f"hdr Retry-After {NO_POD_RETRY_AFTER_S} hdr {ANSWERED_BY} balancer"
    )
    servers = "\n".join(f"    server pod{i} 127.0.0.1:{pod}" for i, pod in enumerate(pods))
    return f"""global
    maxconn {frontend_maxconn(connections)}

defaults
    mode http
    option http-keep-alive
    option abortonclose
    timeout connect {CONNECT_TIMEOUT_S}s
    timeout client {idle}
    timeout http-request {idle}
    timeout http-keep-alive {idle}
    timeout queue {int(queue_s * 1000)}ms
    timeout server {int(server_s * 1000)}ms
    timeout check {CHECK_TIMEOUT_S}s
    retries {CONNECT_RETRIES}
    option redispatch 1
    http-error {busy}

frontend shop
    bind {bind}
    maxconn {frontend_maxconn(connections)}
    http-request return {busy} if {{ nbsrv(pods) lt 1 }}
    default_backend pods

backend pods
    balance roundrobin
    option httpchk
    http-check send meth GET uri {health_path}
    http-check expect status 200
    default-server check inter {HEALTH_INTERVAL_MS}ms fall 2 rise 1 maxconn {per_pod} {MARK_DOWN_ON_REFUSAL}
{servers}
"""


def start_haproxy(*, config: str, run_dir: Path, name: str, cwd: Path, listening: socket.socket | None = None) -> Child:
    """Check ``config`` with ``haproxy -c`` and start HAProxy in the foreground with it.

    ``listening``: the socket ``config`` binds as :data:`INHERITED_BIND`, listening since its port
    was chosen (:func:`processes.children.listening_socket`); the check and HAProxy get it open as
    descriptor :data:`LISTENING_FD` (the check reads its address: without it ``haproxy -c`` refuses
    the line). HAProxy takes
    it over as it is, backlog included (:func:`frontend_maxconn`), so no other process can take the
    port between its choice and HAProxy's start, and connections made meanwhile wait in its queue.
    ``-db`` keeps HAProxy one process in the foreground (no daemon, no master-worker fork). This
    process's copy is closed once HAProxy has started (or failed to): the port is HAProxy's alone.
    """
    fds = {LISTENING_FD: listening.fileno()} if listening is not None else {}
    try:
        path = run_dir / f"{name}-haproxy.cfg"
        path.write_text(config)
        binary = haproxy_binary()
        check = Child(
            f"{name} haproxy -c",
            [binary, "-c", "-q", "-f", str(path)],
            cwd=cwd,
            env={},
            log_path=run_dir / f"{name}-haproxy-check.log",
            fds=fds,
        )
        check.start()
        if check.process.wait(30) != 0:
            check.stop()
            raise BalancerError(f"haproxy refused {path}: {check.log_tail()}")
        check.stop()
        haproxy = Child(
            "haproxy",
            [binary, "-db", "-f", str(path)],
            cwd=cwd,
            env={},
            log_path=run_dir / f"{name}-haproxy.log",
            fds=fds,
        )
        haproxy.start()
        return haproxy
    finally:
        if listening is not None:
            listening.close()
