"""HAProxy in front of the pods (loadtests/balancer.py): a real haproxy process, real sockets."""

from __future__ import annotations

import os
import re
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

import pytest

from loadtests.balancer import (
    HOLDS_AT_MOST_S,
    INHERITED_BIND,
    BalancerError,
    frontend_maxconn,
    haproxy_config,
    start_haproxy,
)
from loadtests.connection import NETWORK_TIMEOUT_S
from processes.children import listening_socket
from tests.helpers import stand_in

#: Slow lane: HAProxy and pods of its own.
pytestmark = pytest.mark.slow

HEALTH = "/api/products/x"


CONNECTIONS = 100


def config(bind: str, pods: list[int], per_pod: int = 2, **timeouts) -> str:
    return haproxy_config(
        bind=bind, pods=pods, health_path=HEALTH, connections=CONNECTIONS, per_pod=per_pod, idle_s=30, **timeouts
    )


def burst_config() -> str:
    """The configuration a burst row's balancer gets (loadtests/pods.py), for 5,000 shoppers."""
    return haproxy_config(bind=INHERITED_BIND, pods=[2], health_path=HEALTH, connections=5016, per_pod=16, idle_s=300)


def seconds(config: str, name: str) -> float:
    """A ``timeout <name>`` of ``config``, in seconds."""
    [value] = re.findall(rf"^\s*timeout {name} (\d+)(ms|s)$", config, re.MULTILINE)
    return int(value[0]) / (1000 if value[1] == "ms" else 1)


def get(url: str | urllib.request.Request):
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


class Pod(BaseHTTPRequestHandler):
    """A stand-in pod: answers every GET 200 and counts the POSTs it receives."""

    posts = 0
    timeout = 5  # a connection that sends nothing does not hold its thread past the test

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def do_POST(self):  # noqa: N802
        type(self).posts += 1
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@contextmanager
def released(release: threading.Event):
    """Set ``release`` when the block ends, however it ends: a `SlowPod` thread waiting on it is
    joined right after (:func:`stand_in`)."""
    try:
        yield
    finally:
        release.set()


@pytest.fixture
def dead_port():
    """A port where nothing answers for the whole test: bound, never listening, so a connection is
    refused. A port that was merely free when chosen can be taken meanwhile: seen in a fresh
    clone's full run, where the no-pod test got a 200 from whatever listened there 1.5 s later."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.fixture
def balancer(tmp_path):
    started = []

    def start(pods: list[int], **sizing):
        """HAProxy on a socket listening from its choice on (``bind fd@N``), as a burst row's balancer."""
        sock = listening_socket(backlog=frontend_maxconn(CONNECTIONS))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        haproxy = config(INHERITED_BIND, pods, **sizing)
        child = start_haproxy(config=haproxy, run_dir=tmp_path, name="t", cwd=tmp_path, listening=sock)
        started.append(child)
        # The port listens already: an answer, whatever its status, says HAProxy has taken it over. A
        # request queued on the socket is reset if HAProxy exits instead (seen when it refused a
        # descriptor numbered past its table): asked again while it runs, as wait_until_answers does.
        deadline, status = time.monotonic() + 10, None
        while status is None and child.running() and time.monotonic() < deadline:
            try:
                status, _, _ = get(url + HEALTH)
            except ConnectionError:
                time.sleep(0.05)
        assert child.running() and status in {200, 503}, f"haproxy did not answer ({status}): {child.log_tail()}"
        return url

    yield start
    for child in started:
        child.stop()


def test_a_balancer_started_by_a_process_with_many_descriptors_open_takes_its_socket(balancer, dead_port):
    """A fresh clone's full run: three tests here failed with HAProxy's "not enough free sockets
    (raise '-n' parameter)": the test worker's listening socket had a descriptor number past the
    table HAProxy sizes for a few connections. The socket is HAProxy's descriptor 3 whatever its
    number here."""
    with open(os.devnull) as null:
        crowd = [os.dup(null.fileno()) for _ in range(600)]
        try:
            url = balancer([dead_port])  # its listening socket's number is past 600 here
        finally:
            for fd in crowd:
                os.close(fd)
    status, _, _ = get(url + HEALTH)
    assert status == 503


def test_no_pod_up_is_a_503_with_retry_after(balancer, dead_port):
    url = balancer([dead_port])  # nothing listens there
    time.sleep(1.5)  # the health check marks the pod down
    status, headers, body = get(url + HEALTH)
    assert status == 503 and headers["Retry-After"] == "1" and b"no pod is up" in body
    assert headers["X-Answered-By"] == "balancer"  # no pod saw it: the access-log count leaves it out


def test_a_dead_pod_is_routed_around_and_a_post_reaches_a_pod_once(balancer, dead_port):
    Pod.posts = 0
    with stand_in(Pod) as server:
        url = balancer([dead_port, server.server_address[1]])  # the first pod is down
        time.sleep(1.5)
        for _ in range(6):
            request = urllib.request.Request(url + "/api/products/x/purchase", data=b"{}", method="POST")
            with urllib.request.urlopen(request, timeout=5) as response:
                assert response.status == 201
        assert Pod.posts == 6


class BusyPod(Pod):
    """A stand-in pod whose threads are all busy: every answer takes a second and a half."""

    def do_GET(self):  # noqa: N802
        time.sleep(1.5)
        super().do_GET()


def test_a_busy_pod_is_not_marked_down(balancer):
    # Seen in a kill-pod run: with one pod killed, the other, saturated, took over half a second to
    # answer its health check, HAProxy marked it down too, and answered "no pod is up" itself.
    with stand_in(BusyPod) as server:
        url = balancer([server.server_address[1]])
        time.sleep(4)  # several health checks, each answered after 1.5 s
        status, headers, _ = get(url + HEALTH)
        assert status == 200 and "X-Answered-By" not in headers


def test_a_stand_in_pod_leaves_no_thread_behind(capfd):
    """A request still being answered when its stand-in's block ends (HAProxy gone mid-answer): its
    thread is joined before the test goes on, and the broken pipe it ends in prints nothing."""
    before = set(threading.enumerate())
    with stand_in(BusyPod) as server:
        client = socket.create_connection(server.server_address, timeout=5)
        client.sendall(b"GET /api/products/x HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.2)  # the pod is asleep in its answer
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # reset: the answer's write fails
    assert set(threading.enumerate()) - before == set()
    assert "Traceback" not in capfd.readouterr().err


def test_a_configuration_haproxy_refuses_is_a_clear_error(tmp_path):
    with pytest.raises(BalancerError, match="haproxy refused"):
        start_haproxy(config="frontend x\n    bind 127.0.0.1:notaport\n", run_dir=tmp_path, name="t", cwd=tmp_path)


class SlowPod(Pod):
    """A stand-in pod that answers a POST only once ``release`` is set (the test's own hook)."""

    release = threading.Event()

    def do_POST(self):  # noqa: N802
        type(self).posts += 1
        self.rfile.read(int(self.headers["Content-Length"]))
        self.release.wait(10)
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()


def post(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(b"POST /api/products/x/purchase HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
    return sock


def test_a_purchase_its_client_gave_up_on_never_reaches_a_pod(balancer):
    SlowPod.posts = 0
    SlowPod.release.clear()
    with stand_in(SlowPod) as server, released(SlowPod.release):
        port = int(balancer([server.server_address[1]], per_pod=1).rsplit(":", 1)[1])
        first = post(port)  # the pod's one slot: the next purchase queues in HAProxy
        deadline = time.monotonic() + 5
        while SlowPod.posts < 1:
            assert time.monotonic() < deadline, "the first purchase never reached the pod"
            time.sleep(0.02)
        post(port).close()  # queued, and its client gives up (as a Connection does on its timeout, then resends)
        time.sleep(0.5)
        SlowPod.release.set()
        assert b" 201 " in first.recv(100)
        first.close()
        time.sleep(0.5)
        assert SlowPod.posts == 1, "a purchase whose client had gone reached the pod after it (a resend races it)"


def test_the_balancer_answers_before_the_client_gives_up():
    config = burst_config()
    retries = int(re.search(r"^\s*retries (\d+)$", config, re.MULTILINE).group(1))
    held = seconds(config, "connect") * (retries + 1) + seconds(config, "queue") + seconds(config, "server")
    assert held < NETWORK_TIMEOUT_S, (
        f"HAProxy may hold a purchase {held:g} s, the client resends after {NETWORK_TIMEOUT_S:g} s"
    )
    assert "option abortonclose" in config, "a queued purchase whose client has gone is still sent to a pod"
    assert held == HOLDS_AT_MOST_S


def test_a_purchase_queued_past_the_balancers_bound_is_answered_busy_and_never_reaches_a_pod(balancer):
    SlowPod.posts = 0
    SlowPod.release.clear()
    with stand_in(SlowPod) as server, released(SlowPod.release):
        url = balancer([server.server_address[1]], per_pod=1, queue_s=1)
        first = post(int(url.rsplit(":", 1)[1]))
        deadline = time.monotonic() + 5
        while SlowPod.posts < 1:
            assert time.monotonic() < deadline, "the first purchase never reached the pod"
            time.sleep(0.02)
        queued = urllib.request.Request(url + "/api/products/x/purchase", data=b"{}", method="POST")
        status, headers, body = get(queued)  # it waits behind the first one
        assert (status, headers["Retry-After"], headers["X-Answered-By"]) == (503, "1", "balancer"), body
        SlowPod.release.set()
        assert b" 201 " in first.recv(100)
        first.close()
        assert SlowPod.posts == 1, "the busy answer came from HAProxy: no pod saw that purchase, a resend is safe"
