"""Issue 28's done-when, read off a burst's rows: each target, its figure, met or not.

The issue sets its targets on ``flashsale --scenario deep --batch 1,64 --repeat 3``'s medians: a
purchase alone (BATCH 1) and batched against the floor, a batched row against its own BATCH 1
row, the batch size a section gathered; a spike's or a flash sale's rows are not read against
them. :func:`verdicts` reads them off the rows the command printed (the medians, or the runs when
there was one), so a run says itself which targets it met instead of a reader working them out
from the table. A target whose rows did not run is left out. Each ratio is a figure of the machine
it ran on (docs/batching.md, Figures): read it from a quiet machine.

Next to a ratio stands the most the row's CPU allows: the floor round's CPU a request (pods,
PostgreSQL, Redis, lock service, Locust) over the row's CPU a purchase. A row cannot sell faster
than that share of the floor's rate without making its purchases cheaper: a row alone below it
leaves cores idle between holders (its guard's hand-over binds), a batched row at it is bound by
the cores. Beside a batched row's multiple of its own BATCH 1 stands the same bound in its units
(the batched row's bound times its floor round's rate, over the BATCH 1 row's rate). On two cores
the floor round itself leaves some CPU idle, so a row can end a little above its bound.

Beside a row alone whose guard is a lock (it waited for one) stands a second bound: one holder at
a time, each holding it for the row's mean hold (grant to release), sells at most one purchase a
hold, whatever the CPU. Below both, the hand-over between holders binds too.

A ``--repeat`` run's figure also stands beside its lowest and highest round. A row's rounds move by
a quarter of the floor on these 2-core VMs, so a target whose rounds fall on both sides of it is met
or missed by the luck of the run; the count says on how many that happened (:func:`tally`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from loadtests.plan import FLOOR, queue_of, via_of


@dataclass(frozen=True)
class Target:
    strategy: str
    what: str  # "alone", "batched" (× floor), "own" (× its BATCH 1 rate), "batch_p50"
    minimum: float


TARGETS = [
    Target("db", "alone", 0.25),
    Target("redis", "alone", 0.25),
    *(Target(name, "batched", 0.5) for name in ("db", "redis", "redlock")),
    *(Target(name, "own", 3.0) for name in ("db", "redis", "redlock")),
    *(Target(name, "batch_p50", 5) for name in ("db", "redis", "redlock")),
    Target("atomic", "batched", 0.7),
    Target("redis-stock", "batched", 0.7),
]

_LABELS = {
    "alone": "{name} at BATCH 1 ≥ {minimum:g}× the floor",
    "batched": "{name} batched ≥ {minimum:g}× the floor",
    "own": "{name} batched ≥ {minimum:g}× its own BATCH 1",
    "batch_p50": "{name} batch p50 ≥ {minimum:g}",
}


@dataclass(frozen=True)
class Bound:
    """The most a figure can reach (``value``), ``said`` in words ("its CPU a purchase allows
    0.26×") and named ``short`` in a chart ("CPU")."""

    said: str
    value: float
    short: str


@dataclass(frozen=True)
class Verdict:
    target: Target
    value: float
    #: What the row's own measurements allow the figure, beside it (:func:`cpu_bound`, :func:`hold_bound`).
    bounds: tuple[Bound, ...] = ()
    #: The rows the figure is read off that broke an invariant (their sales are not to be trusted).
    broken: tuple[str, ...] = ()
    #: The figure in each round of a ``--repeat`` run, in the order they ran (:func:`round_figures`;
    #: empty with fewer than two).
    rounds: tuple[float, ...] = ()

    @property
    def met(self) -> bool:
        return self.value >= self.target.minimum and not self.broken

    @property
    def undecided(self) -> bool:
        """Its rounds fell on both sides of the target: the median's side is the luck of the run."""
        return self.spread is not None and self.spread[0] < self.target.minimum <= self.spread[1]

    @property
    def spread(self) -> tuple[float, float] | None:
        """Its lowest and highest round, or None without two rounds."""
        return (min(self.rounds), max(self.rounds)) if len(self.rounds) > 1 else None

    @property
    def label(self) -> str:
        return _LABELS[self.target.what].format(name=self.target.strategy, minimum=self.target.minimum)

    @property
    def shown(self) -> str:
        """The figure as printed: a ratio to as many places as tell met from not (:func:`shown_against`)."""
        return shown_against(self.value, self.target.minimum) if self.target.what != "batch_p50" else f"{self.value:g}"

    def line(self) -> str:
        shown = self.shown if self.target.what == "batch_p50" else f"{self.shown}×"  # a count has no unit
        why = f" ({' and '.join(self.broken)} broke an invariant)" if self.broken else ""
        allows = "; ".join([*(bound.said for bound in self.bounds), *self._rounds_said()])
        return f"  {self.label}: {shown}  {'met' if self.met else 'NOT met'}{why}" + (f"  ({allows})" if allows else "")

    def _rounds_said(self) -> list[str]:
        if self.spread is None:
            return []
        lowest, highest = self.spread
        low, high = f"{lowest:.2f}", f"{highest:.2f}"
        if low == high:  # 0.181 and 0.184 read "0.18–0.18": a third place, or one figure for all
            low, high = f"{lowest:.3f}", f"{highest:.3f}"
        said = f"its rounds {low}–{high}×" if low != high else f"its rounds all {low}×"
        return [f"{said}, on both sides of the target" if self.undecided else said]


def shown_against(value: float, minimum: float) -> str:
    """``value`` to the hundredth, or to as many more places (up to four) as it takes for the shown
    figure to fall on the same side of ``minimum`` as the figure itself: 0.247 against 0.25 showed
    as "0.25×  NOT met"."""
    for places in (2, 3, 4):
        shown = f"{value:.{places}f}"
        if (float(shown) >= minimum) == (value >= minimum):
            break
    return shown


def cpu_bound(row: dict) -> float | None:
    """The floor round's CPU a request over this row's CPU a purchase: the most × floor the row
    reaches at its CPU cost (None when either was not measured)."""
    share = _cpu_share(row)
    return round(share, 2) if share is not None else None


def _measured(row: dict, *path: str, zero: bool = False) -> float | None:
    """The positive number (with ``zero``, or 0) at ``path`` in ``row`` (``"floor", "rps"``), else
    None: a figure the document lacks, or holds as something else (a hand-edited file), is not read."""
    value: object = row
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value) if value > 0 or (zero and value == 0) else None


def _cpu_share(row: dict) -> float | None:
    own, floor = _measured(row, "cpu_ms", "total"), _measured(row, "floor", "cpu_ms", "total")
    return floor / own if own and floor else None


def _allows(bound: float | None, hold: tuple[float, float] | None = None) -> tuple[Bound, ...]:
    found = [Bound(f"its CPU a purchase allows {bound:.2f}×", bound, "CPU")] if bound is not None else []
    if hold is not None:
        said = f"one holder at a time for its mean hold, {hold[0]:.2f} ms, allows {hold[1]:.2f}×"
        found.append(Bound(said, hold[1], "hold"))
    return tuple(found)


def hold_bound(alone: dict) -> tuple[float, float] | None:
    """(the mean hold in ms, the most × floor it allows) for a row alone whose purchases waited for
    a lock: one holder at a time sells at most one purchase a hold. None without a lock's wait (a
    row lock's transaction counts its own wait in its hold) or without the figures."""
    hold, waited = _measured(alone, "breakdown", "lock_hold_ms"), _measured(alone, "breakdown", "lock_wait_ms")
    floor_rps = _measured(alone, "floor", "rps")
    if not hold or not waited or not floor_rps:
        return None
    return hold, round(1000.0 / hold / floor_rps, 2)


def own_bound(alone: dict, batched: dict) -> float | None:
    """The most × its own BATCH 1 rate the batched row's CPU allows (None when not measured)."""
    bound, floor_rps, alone_rps = _cpu_share(batched), _measured(batched, "floor", "rps"), _measured(alone, "rps")
    return round(bound * floor_rps / alone_rps, 2) if bound and floor_rps and alone_rps else None


def _rows(rows: list[dict]) -> dict[tuple[str, bool], dict]:
    """Each strategy's BATCH 1 row and its largest batched row of the deep scenario (the one the
    targets are set on), on the first way the rows ran (balancer and server) and on the in-process
    queue, as the issue measured them. A row that names no scenario is read as deep."""
    first = next((via_of(row) for row in rows), None)
    found: dict[tuple[str, bool], dict] = {}
    for row in rows:
        if row["row"] == FLOOR or row.get("scenario", "deep") != "deep":
            continue
        if via_of(row) != first or queue_of(row) != "local":
            continue
        size = row.get("batch") or 1
        if isinstance(size, bool) or not isinstance(size, int):
            continue  # a document edited by hand: the row's size is not known
        batched = size > 1
        key = (row["row"], batched)
        if not batched or key not in found or row["batch"] > found[key]["batch"]:
            found[key] = row
    return found


def _broken(*rows: dict) -> tuple[str, ...]:
    """Which of ``rows`` broke an invariant, by name (``db ×1``, ``db ×64``): a figure read off one is not met."""
    return tuple(f"{row['row']} ×{row.get('batch') or 1}" for row in rows if row.get("invariants_ok") is False)


def verdicts(rows: list[dict]) -> list[Verdict]:
    """Every target whose rows ran, in :data:`TARGETS`'s order; one read off a row that broke an
    invariant is not met, whatever its figure."""
    found = _rows(rows)
    out = []
    for target in TARGETS:
        alone, batched = found.get((target.strategy, False)), found.get((target.strategy, True))
        row = alone if target.what == "alone" else batched
        figure = {"alone": "floor_ratio", "batched": "floor_ratio", "batch_p50": "batch_p50"}.get(target.what)
        value = _measured(row, figure, zero=True) if row and figure else None
        if target.what == "alone" and value is not None:
            bounds = _allows(cpu_bound(alone), hold_bound(alone))
            out.append(Verdict(target, value, bounds, _broken(alone), round_figures(alone)))
        elif target.what == "batched" and value is not None:
            out.append(Verdict(target, value, _allows(cpu_bound(batched)), _broken(batched), round_figures(batched)))
        elif target.what == "own" and alone and batched and (rates := _rates(alone, batched)) is not None:
            ratio = rates[1] / rates[0]  # not rounded first: 2.996 rounded to 3.00 read as met
            bounds = _allows(own_bound(alone, batched))
            out.append(Verdict(target, ratio, bounds, _broken(alone, batched), round_figures(alone, batched)))
        elif target.what == "batch_p50" and value is not None:
            out.append(Verdict(target, value, broken=_broken(batched)))
    return out


def round_figures(row: dict, batched: dict | None = None) -> tuple[float, ...]:
    """A ``--repeat`` row's figure in each of its rounds (``rounds``, :func:`~loadtests.figures.median_run`):
    its ratio to its own pods' floor round; with ``batched``, the batched row's purchases/s over this
    BATCH 1 row's in the same round. Empty for a row of one run, or rounds that are not all figures
    (a document edited by hand): no spread is claimed then."""
    mine, theirs = _round_list(row), _round_list(batched) if batched is not None else None
    if theirs is None:
        figures = [_measured(one, "floor_ratio", zero=True) for one in mine]
    elif len(theirs) == len(mine):
        rates = [_rates(alone, batched) for alone, batched in zip(mine, theirs, strict=True)]
        figures = [pair[1] / pair[0] if pair is not None else None for pair in rates]
    else:
        return ()
    return tuple(figures) if len(figures) > 1 and None not in figures else ()  # type: ignore[arg-type]


def _round_list(row: dict) -> list[dict]:
    rounds = row.get("rounds")
    return rounds if isinstance(rounds, list) and all(isinstance(one, dict) for one in rounds) else []


def _rates(alone: dict, batched: dict) -> tuple[float, float] | None:
    """(the BATCH 1 row's purchases/s, the batched row's) when both are figures, the first above 0."""
    pair = _measured(alone, "rps"), _measured(batched, "rps", zero=True)
    return pair if None not in pair else None


def verdict_lines(rows: list[dict]) -> list[str]:
    """The verdicts as the command prints them, with a count; nothing when no target's rows ran."""
    found = verdicts(rows)
    if not found:
        return []
    return [
        "against issue 28's targets (a figure of this machine: read it from a quiet one):",
        *(verdict.line() for verdict in found),
        f"  {tally(found)}",
    ]


def tally(found: list[Verdict]) -> str:
    """How many were met ("8 of 13 met"), and on how many the rounds fell on both sides of the target (the median then
    decides met or not by the luck of the run, and one run cannot settle it)."""
    met = sum(verdict.met for verdict in found)
    undecided = [verdict for verdict in found if verdict.undecided]
    said = f"{met} of {len(found)} met"
    if undecided:
        said += (
            f"; on {len(undecided)} of them the rounds fell on both sides of the target:"
            " another run may read them either way"
        )
    return said
