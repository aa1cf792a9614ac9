"""One Locust worker's share of the flash sale (:class:`Sale`): its shoppers, the gate, and the
figures it counts, reported to the master a slice at a time (:meth:`Sale.report`).

The master decides the share (``loadtests/conductor.py``): it hands the worker the global index
of its first user, the number of users in the whole sale and the number of purchases; global
user ``g`` prepares shoppers ``g, g + users, g + 2 × users, ...`` below the purchase count, so
the shares add up to exactly the sale's purchases whatever the number of workers.

Once a round opens, each user sends purchases from its worker's queue of that round's purchases
(:meth:`Sale.next_purchase`) until none is left, not only its own shoppers': a user whose pod
answers faster sends more, so every user keeps sending until the round's last purchases. With a
fixed quota each, the users on a gunicorn worker that accepted fewer keep-alive connections finish
early, and the round's last part runs on the worker holding the most, one process on one core
while the others idle (measured: 53, 21, 14 and 12 of 100 connections on a pod's four workers).
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict, deque
from typing import TYPE_CHECKING, Callable, Protocol

from gevent.event import Event

from loadtests.figures import TIMING_KEYS, add_breakdown, parse_server_timing
from loadtests.messages import BODY_COUNTS, SERIES, TOTALS

if TYPE_CHECKING:
    from geventhttpclient.header import Headers


class Opener(Protocol):
    """A shopper whose first purchase is written at the opening (the locustfile's ``Shopper``)."""

    first_send: float | BaseException | None

    def send_now(self, request: bytes) -> float | OSError: ...


class Sale:
    """This worker's share of the sale: its shoppers, the gate, and what came back."""

    def __init__(self, rounds: int = 1) -> None:
        self.next_user = 0  # Shopper instances take their local index from here
        self.users_announced = 0  # the user count last told to the master
        self.offset = 0  # global index of this worker's first user
        self.total_users = 1  # users in the whole sale
        self.purchases = 0  # purchases in the whole sale
        self.limit = 0  # this worker's purchases (per round)
        self.rounds = rounds  # sales run one after the other by the same prepared shoppers
        self.shared = Event()  # the master has told the share
        self.gates = [Event() for _ in range(rounds)]  # round r is open
        self.armed: Counter[int] = Counter()  # round → shoppers whose request for it is built
        self.ready_told: set[int] = set()  # rounds this worker has said it is ready for
        self.phase = "preparing"
        self.prepared = 0
        self.page_failures = 0  # shoppers whose preparation failed every attempt
        self.errors: list[str] = []  # exceptions in the locustfile's own code: the run is void
        self.opening: list[list[tuple[Opener, bytes]]] = [[] for _ in range(rounds)]  # spike: written at the opening
        # round → the built purchases no user has sent yet (:meth:`next_purchase`)
        self.unsent: defaultdict[int, deque[bytes]] = defaultdict(deque)
        self.on_round_end: Callable[[Sale], None] | None = None  # told once this worker's round is answered
        self.start_round(0)

    def start_round(self, number: int) -> None:
        """Fresh figures for round ``number``: every counter, list and report position starts over."""
        self.round = number
        self.sent = 0  # purchases sent (a resent purchase counts once)
        self.answered = 0  # purchases with a final answer (or a transport error)
        self.status_counts: Counter[str] = Counter()  # final answers; "0" = no HTTP answer
        self.busy = 0  # final 503 + Retry-After answers (retries exhausted)
        self.client_retries = 0  # resends after a 503 + Retry-After
        self.transport_resends = 0  # resends after no HTTP answer or a balancer's 502 (a reset connection, a dead pod)
        self.balancer_answers = 0  # answers the balancer gave itself (no pod saw the request)
        self.transport_errors = 0
        self.counts = Counter()  # conflicts, retries, constraint_hits from the response bodies
        self.outcomes: Counter[str] = Counter()  # the body's "outcome" of each final answer
        self.latencies_ms: list[float] = []
        self.sent_times: list[float] = []  # wall clock of each purchase's first send
        self.answer_times: list[float] = []  # wall clock of each purchase's final answer
        # Per purchase: [first send, final answer (wall clock), final status, server's lock wait ms or None,
        # wall clock of each 503 + Retry-After answer it got (resent or final), of each try that got no answer
        # and was resent]
        self.purchases_done: list[list] = []
        self.timing: dict[str, list[float]] = {name: [] for name in TIMING_KEYS}
        self.breakdown: Counter[str] = Counter()  # the parts of the answers whose section ran, summed
        self.first_sent_at: float | None = None  # the earliest send of the round, whichever answer came first
        self.last_sent_at: float | None = None
        self.last_answered_at: float | None = None
        self.last_confirmed_at: float | None = None
        self._reported: dict[str, int] = {}  # how much of each list earlier reports carried

    def note_sent(self, at: float) -> None:
        """A purchase's first send: the round's first and last send times include it."""
        self.first_sent_at = at if self.first_sent_at is None else min(self.first_sent_at, at)
        self.last_sent_at = at if self.last_sent_at is None else max(self.last_sent_at, at)

    def arm(self, number: int, shoppers: int) -> None:
        """``shoppers`` more of this worker's shoppers have their request for round ``number`` built."""
        self.armed[number] += shoppers

    def queue(self, number: int, requests: list[bytes]) -> None:
        """Purchases built for round ``number``, for any user to send, to whichever pod it is connected to.

        One queue for all pods, not one per pod: a user whose pod died fails over to the next and
        sends there, and a queue per pod would keep the dead pod's purchases unsent for the rest of
        the round (a request names the pod it was built for in its Host header, which the shop does
        not read: failing over sent such requests to another pod before the queue, too)."""
        self.unsent[number].extend(requests)

    def next_purchase(self, number: int) -> bytes | None:
        """The next unsent purchase of round ``number`` (None: every one has been taken)."""
        waiting = self.unsent.get(number)
        return waiting.popleft() if waiting else None

    def ready_for(self, number: int) -> bool:
        """Every shopper of this worker has its request for round ``number`` built (or failed to prepare)."""
        return self.shared.is_set() and self.armed[number] + self.page_failures >= self.limit

    def take_share(self, *, offset: int, users: int, purchases: int, local_users: int) -> None:
        """The master's share: global user ``offset`` onward, of ``users`` buying ``purchases``."""
        self.offset, self.total_users, self.purchases = offset, max(1, users), purchases
        self.limit = sum(self.shoppers_of(index) for index in range(local_users))
        self.shared.set()

    def shoppers_of(self, user_index: int) -> int:
        """How many shoppers local user ``user_index`` (0-based) prepares and buys for."""
        return len(range(self.offset + user_index, self.purchases, self.total_users))

    def record(
        self,
        status: int,
        headers: Headers | None,
        body: bytes,
        *,
        busy: bool,
        started: float,
        busy_at: list[float],
        reset_at: list[float],
    ) -> None:
        """A purchase's final answer (status 0: none): its server timing and its JSON body."""
        finished = time.time()
        timing = parse_server_timing(headers.get("Server-Timing") if headers else None)
        try:
            payload = json.loads(body or b"{}")
        except ValueError:
            payload = {}
        payload = payload if isinstance(payload, dict) else {}
        self.answered += 1
        self.last_answered_at = finished
        self.latencies_ms.append(round((finished - started) * 1000, 2))
        self.sent_times.append(round(started, 4))
        self.answer_times.append(round(finished, 4))
        self.status_counts[str(status)] += 1
        self.transport_errors += status == 0
        self.busy += busy
        if status == 201:
            self.last_confirmed_at = finished
        for name, value in timing.items():
            if name in self.timing:
                self.timing[name].append(value)
        add_breakdown(self.breakdown, timing)
        self.purchases_done.append(
            [round(started, 4), round(finished, 4), status, timing.get("lock"), busy_at, reset_at]
        )
        if isinstance(payload.get("outcome"), str):
            self.outcomes[payload["outcome"]] += 1
        for name in BODY_COUNTS:
            value = payload.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                self.counts[name] += value
        if self.finished and self.on_round_end is not None:
            self.on_round_end(self)

    @property
    def finished(self) -> bool:
        return bool(self.errors) or (self.shared.is_set() and self.answered + self.page_failures >= self.limit)

    def progress(self) -> dict:
        return {"phase": self.phase, "round": self.round, **{name: getattr(self, name) for name in TOTALS}}

    def report(self, *, whole: bool = False) -> dict:
        """Totals so far and what the lists gained since the last report (``whole``: everything of
        the round, marked ``whole``, which replaces what the master kept of this worker's round:
        a periodic report built before it may reach the master after it); ``finished`` once this
        report carries the last purchase."""
        if whole:
            self._reported = {}
        finished = self.finished
        data = {
            **self.progress(),
            "whole": whole,
            "finished": finished,
            **{name: self.counts[name] for name in BODY_COUNTS},
            "status_counts": dict(sorted(self.status_counts.items())),
            "outcomes": dict(sorted(self.outcomes.items())),
            "errors": list(self.errors),
            "first_sent_at": self.first_sent_at,
            "last_sent_at": self.last_sent_at,
            "last_answered_at": self.last_answered_at,
            "last_confirmed_at": self.last_confirmed_at,
            "breakdown": dict(self.breakdown),
        }
        for name in SERIES:
            data[name] = self._since_last(name, getattr(self, name if name != "purchases" else "purchases_done"))
        data["server_timing"] = {key: self._since_last(f"timing:{key}", values) for key, values in self.timing.items()}
        return data

    def _since_last(self, name: str, values: list) -> list:
        start = self._reported.get(name, 0)
        self._reported[name] = len(values)
        return values[start:]
