"""What a burst row is asked to do: the scenarios, the plan's sizing, its error and the live progress it reports."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

from processes.ports import LOCUST_MASTER_PORT

FLOOR = "floor"
#: How the shoppers reach the pods: each straight to one (round robin by user), or through HAProxy.
BALANCERS = ("none", "haproxy")
#: The pods' servers (SHOP_SERVER): gunicorn's threads and sync views, or uvicorn workers (the purchase on
#: the event loop).
SERVERS = ("wsgi", "asgi")
SCENARIOS = ("spike", "deep", "flash")
SAMPLE_INTERVAL_S = 0.25
#: Shoppers one Locust worker releases within the arrival target on this machine: one worker wrote
#: 5,000 prepared purchases within 0.23 s (flashsale --locust-workers 1), and a second process costs
#: the two cores more at start than it saves at the opening.
SHOPPERS_PER_WORKER = 5000
#: Seconds a shopper's preparation may take at most, on top of a fixed allowance.
PREPARE_ALLOWANCE_S, PREPARE_PER_SHOPPER_S = 60.0, 0.02


def queue_of(run: dict) -> str:
    """Where a row's purchases queued: shared, or local (also a BATCH=1 row's, and an older document's)."""
    return run.get("queue") or "local"


def via_of(run: dict) -> tuple[str, str]:
    """How a row ran: (balancer, server); an older document's rows ran straight to one WSGI pod."""
    return run.get("balancer") or "none", run.get("server", "wsgi")


class BurstError(RuntimeError):
    """The burst could not be run (a process did not start, a service is missing)."""


@dataclass(frozen=True)
class BurstPlan:
    requests: int
    stock: int
    scenario: str = "spike"
    sku: str = "flash-burst"
    pods: int = 1
    users: int = 100  # closed-loop concurrency (deep, flash), across all Locust workers
    workers: int = 4
    threads: int = 4
    pool_max_size: int = 4  # connections per gunicorn worker process
    pool_timeout_s: float = 1.0
    locust_workers: int = 1  # Locust workers, under one Locust master
    master_port: int = LOCUST_MASTER_PORT
    balancer: str = "none"  # one of BALANCERS
    max_retries: int = 3
    countdown_s: float = 0.5
    timeout_s: float = 180.0
    fault: str | None = None  # a name of faults.registry.FAULT_NAMES, injected into every row
    fault_hold_s: float | None = None  # how long the fault lasts; None: the fault's own default
    fenced: bool = True  # False: the pods run with INVENTORY_FENCED=0 (the storage check off)
    batch: int = 1  # INVENTORY_BATCH of the pods: purchases one section may serve
    queue: str = "local"  # INVENTORY_QUEUE of the pods (BATCH > 1): local, in the worker; shared, in Redis
    yardstick: bool = False  # after Locust, the plain client on the floor endpoint of the same pods
    floor_round: bool = True  # each row posts to the floor endpoint on its own pods before it buys
    sales: int = 1  # purchase rounds per row on the same pods and shoppers, a fresh product each (--sales)
    server: str = "wsgi"  # SHOP_SERVER of the pods: one of SERVERS

    @property
    def sale_stock(self) -> int:
        """Units on sale: ``deep`` puts one on the shelf per purchase, so every purchase reaches the strategy."""
        return self.requests if self.scenario == "deep" else self.stock

    def sale_sku(self, number: int) -> str:
        """The product of the row's sale ``number`` (0-based): the plan's SKU, then ``<sku>-2``, ``<sku>-3``..."""
        return self.sku if number == 0 else f"{self.sku}-{number + 1}"

    @property
    def prepare_timeout_s(self) -> float:
        return PREPARE_ALLOWANCE_S + PREPARE_PER_SHOPPER_S * self.requests


def default_locust_workers(*, scenario: str, requests: int) -> int:
    """Enough Locust workers for the spike to leave within its target; one for the closed loops."""
    return max(1, math.ceil(requests / SHOPPERS_PER_WORKER)) if scenario == "spike" else 1


@dataclass
class Progress:
    """What the live progress line shows; handed to the caller's callback every sample."""

    backend: str
    requests: int
    phase: str = "starting"  # starting, preparing, countdown, burst
    prepared: int = 0
    sent: int = 0
    answered: int = 0
    stock: int | None = None
    opens_in_s: float = 0.0
    elapsed_s: float = 0.0  # since the opening
    finished: bool = False  # the last sample: the Locust master has exited
    opened_at: float | None = None  # wall clock of the opening
    sales: int = 1  # the row's sales (purchase rounds)
    sale: int = 0  # the sale running or being prepared, from 1 (0: a floor round before the first)
    # Per round: (wall clock, since its opening, stock of its product) every sample while it ran
    samples: dict[int, list[tuple[float, float, int | None]]] = field(default_factory=dict)
    steps: dict[str, float] = field(default_factory=dict)  # where the row's wall-clock time went, in order
    # CPU seconds by process group (loadtests/cpu.py) as each step ended, while ``meter`` is set;
    # a round's countdown at the last look before the round opened (burst.note_steps).
    cpu_at: dict[str, dict[str, float] | None] = field(default_factory=dict)
    meter: Callable[[], dict[str, float] | None] | None = field(default=None, repr=False)

    def samples_of(self, number: int) -> list[tuple[float, float, int | None]]:
        """The samples of round ``number`` (0-based), a list kept as it grows."""
        return self.samples.setdefault(number, [])

    @property
    def sale_label(self) -> str:
        """``"sale 2/3: "`` while a row sells more than once, else nothing."""
        return f"sale {max(1, self.sale)}/{self.sales}: " if self.sales > 1 else ""

    def step(self, name: str, since: list[float]) -> None:
        """Note that step ``name`` ended: the seconds since the previous one (``since`` holds its end)."""
        now = time.monotonic()
        self.steps[name] = round(now - since[0], 2)
        since[0] = now
        if self.meter is not None and name not in self.cpu_at:
            self.cpu_at[name] = self.meter()
