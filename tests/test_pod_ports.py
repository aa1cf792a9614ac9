"""A burst pod's port is the pod's from the moment the runner chooses it: held through gunicorn's
start (and again when kill-pod starts the pod anew), so no other process can take it in between
and the balancer and Locust never talk to a stranger on it. Real gunicorn, real sockets."""

from __future__ import annotations

import os
import socket
import time
import urllib.request

import pytest

from loadtests import pods
from loadtests.plan import BurstPlan
from loadtests.pods import RestartablePod, Row
from processes.children import Child, ChildError, ephemeral_ports, listening_socket
from tests.helpers import pod

SKU = "pod-port"


def take(port: int) -> socket.socket | None:
    """Another process's server on ``port`` (listening, as a stranger would), or None if it cannot bind."""
    stranger = socket.socket()
    stranger.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        stranger.bind(("127.0.0.1", port))
        stranger.listen()
    except OSError:
        stranger.close()
        return None
    return stranger


def test_a_port_chosen_at_run_time_is_not_one_the_machine_gives_client_connections():
    """CI, stop 50: a pod killed by kill-pod could not have its port back (``port 52429 was still
    held after the pod was killed``, for 5 s): the kernel had chosen it from the ephemeral range,
    which every client connection of the machine takes its source port from, so once the pod let
    go a connection (a test worker's to PostgreSQL, Locust's to another pod) could take it, and hold
    it in TIME_WAIT for a minute. Pods, balancers and the tests' own pods choose outside it."""
    ephemeral = ephemeral_ports()
    sockets = [listening_socket(backlog=1) for _ in range(40)]
    try:
        chosen = [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
    inside = [port for port in chosen if port in ephemeral]
    assert not inside, f"ports {inside} lie in the ephemeral range {ephemeral.start}-{ephemeral.stop - 1}"
    assert len(set(chosen)) == 40, "two listening sockets were given one port"


def test_a_client_connections_source_port_keeps_a_killed_servers_port_from_it():
    """Why the range matters (the kernel, not the project): a connection whose source port is a
    dead server's port, even closed and in TIME_WAIT, keeps the server from listening there again."""
    server = listening_socket(backlog=1)
    port = server.getsockname()[1]
    server.close()  # the server dies
    client = socket.socket()
    client.bind(("127.0.0.1", port))  # what the kernel does for a connection when the port is in its range
    client.connect(("127.0.0.1", 5432))
    client.close()  # the client hangs up first: its side waits in TIME_WAIT
    with pytest.raises(OSError):
        listening_socket(port, backlog=1).close()


def test_a_connection_made_before_the_server_took_its_socket_does_not_keep_the_port_from_it_later():
    """Seen in 3 of 21 runs of the kill-pod test below (``port … was still held after the pod was killed``,
    ``ss``: the pod's side of a connection in TIME_WAIT): a readiness poll connects while the pod
    boots, to the runner's listening socket; the connection is made from that socket as it is then,
    before gunicorn sets SO_REUSEADDR on it, and when the pod hangs up first its side waits in
    TIME_WAIT for a minute, keeping every later bind of the port from it, SO_REUSEADDR or not."""
    server = listening_socket(backlog=1)
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))  # queued before the server takes the socket
    accepted, _ = server.accept()
    accepted.close()  # the server answers and hangs up first (Connection: close)
    client.close()
    time.sleep(0.1)  # the server's side of the connection is in TIME_WAIT
    server.close()  # the server dies (kill-pod)
    listening_socket(port, backlog=1).close()  # started again on its port


@pytest.fixture
def row(tmp_path, make_product, request):
    """A row of one pod; ``indirect`` param: its balancer (``none``, ``haproxy``)."""
    make_product(SKU, stock=1)
    balancer = getattr(request, "param", "none")
    plan = BurstPlan(requests=8, stock=1, sku=SKU, pods=1, workers=1, threads=1, pool_max_size=1, balancer=balancer)
    started = Row(backend="db", plan=plan, run_dir=tmp_path, scratch=tmp_path)
    yield started
    started.stop()


@pytest.mark.slow  # starts a pod (and HAProxy): make test runs it
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("row", "server"), [("none", "pod"), ("haproxy", "balancer")], indirect=["row"])
def test_a_servers_port_cannot_be_taken_between_its_choice_and_its_start(row, server):
    """The pod's port, and the balancer's in front of it: Locust is told them while the pods boot."""
    row.reserve_ports()
    port = row.ports[0] if server == "pod" else row.balancer_port
    stranger = take(port)  # the moment between the choice and the server's bind, held open
    try:
        assert stranger is None, f"another process took port {port} after the runner chose it for the {server}"
        row.start_pods()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/products/{SKU}", timeout=5) as answer:
            assert answer.status == 200
    finally:
        if stranger is not None:
            stranger.close()


@pytest.mark.slow  # starts a pod, kills it and waits for its port: make test runs it
@pytest.mark.django_db(transaction=True)
def test_a_killed_pod_whose_port_was_taken_meanwhile_is_not_started_on_it(row, monkeypatch):
    monkeypatch.setattr(pods, "REBIND_S", 0.5)  # how long it waits for the killed pod's workers to let go
    row.start_pods()
    [port] = row.ports
    pod = RestartablePod(row, 0)
    pod.kill()  # kill-pod: while the pod is down its port is free, as for any server that died
    deadline = time.monotonic() + 5
    while (stranger := take(port)) is None and time.monotonic() < deadline:
        time.sleep(0.02)  # the killed master's workers, SIGKILLed with it, let go of it as they die
    assert stranger is not None, f"port {port} was still held after the pod was killed"
    try:
        with pytest.raises(ChildError, match=f"gunicorn pod 0: port {port} was taken by another process"):
            pod.start()
    finally:
        stranger.close()
    pod.start()  # the port free again: the pod takes it, past the killed one's connections in TIME_WAIT
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/products/{SKU}", timeout=5) as answer:
        assert answer.status == 200


def serving_port(child: Child) -> int:
    """The port a gunicorn about to start will serve: its inherited socket's (``fd://N``), or the
    one it will bind itself (``host:port``)."""
    bind = child.env["GUNICORN_BIND"]
    if bind.startswith("fd://"):
        with socket.socket(fileno=os.dup(int(bind.removeprefix("fd://")))) as sock:
            return sock.getsockname()[1]
    return int(bind.rsplit(":", 1)[1])


@pytest.mark.slow  # starts a pod: make test runs it
@pytest.mark.django_db(transaction=True)
def test_the_tests_own_pods_port_cannot_be_taken_between_its_choice_and_gunicorns_start(
    tmp_path, make_product, monkeypatch
):
    """The pods the tests start themselves (``tests/helpers.py``'s ``pod``) hold their port as a
    burst's do: another process tries to take it just before the pod's gunicorn starts."""
    make_product(SKU, stock=1)
    start = Child.start

    def start_once_a_stranger_tried(child: Child) -> None:
        port = serving_port(child)
        stranger = take(port)  # the moment between the choice and gunicorn's bind
        if stranger is not None:
            stranger.close()
        assert stranger is None, f"another process took port {port} after the test's pod chose it"
        start(child)

    monkeypatch.setattr(Child, "start", start_once_a_stranger_tried)
    with (
        pod(tmp_path, "db", sku=SKU, server="wsgi", workers=1, threads=1, pool=1) as base,
        urllib.request.urlopen(f"{base}/api/products/{SKU}", timeout=5) as answer,
    ):
        assert answer.status == 200
