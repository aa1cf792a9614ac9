"""The Locust master's side of the flash sale: who buys what, when the gate opens, the figures.

No Locust import and no I/O: ``loadtests/locustfile.py`` feeds it Locust's messages and events.

1. Every worker tells how many users it runs (``users``, once its users are spawned). When the
   counts add up to the users of the sale, :meth:`Conductor.shares` gives each worker, in worker
   index order, the global index of its first user: together the workers send exactly the sale's
   purchases (:meth:`loadtests.sale.Sale.take_share`).
2. Every worker with a share prepares its shoppers and says ``ready``; once all are, the master waits
   the countdown and opens the gate for all of them with one broadcast message. A sale may have
   several rounds (e.g. the floor endpoint, then the purchase, on the same pods): the same
   prepared shoppers buy once per round, and each round opens once every worker has answered
   the previous one and is ready again.
3. Every worker's report (Locust's ``report_to_master`` / ``worker_report``, every
   ``REPORT_INTERVAL_S``) carries its totals and the purchases answered since its previous
   report; :meth:`Conductor.absorb` keeps them, :meth:`Conductor.summary` merges them
   (:func:`loadtests.figures.merge`). A round is over when every worker with a share's last report for
   it says it has finished; the sale is over after the last round (or once a worker reports an
   error in the locustfile). Each report names its round; a late one for another round is dropped.
"""

from __future__ import annotations

from loadtests.figures import merge
from loadtests.messages import LATEST, SERIES


class Conductor:
    """One sale as the master sees it; ``purchases`` = 0 means one purchase per user."""

    def __init__(self, *, purchases: int, rounds: int = 1) -> None:
        self.purchases = purchases
        self.rounds = rounds
        self.round = 0  # the round being prepared or run
        self.done: list[dict] = []  # the summary of every finished round
        self.users: dict[str, tuple[int, int]] = {}  # worker → (its index, its users)
        self.shared: dict[str, dict] = {}  # worker → the share it was sent
        self.ready: dict[int, set[str]] = {}  # round → the workers ready for it
        self.figures: dict[str, dict] = {}  # worker → its report of this round so far (lists accumulated)
        self.phase = "preparing"
        self.opens_at: float | None = None  # wall clock the opening is due (once every worker is ready)
        self.opened_at: float | None = None  # wall clock of this round's opening message

    def count_users(self, worker: str, *, index: int, users: int) -> None:
        self.users[worker] = (index, users)

    def shares(self, total_users: int) -> dict[str, dict]:
        """Once the workers' user counts add up to ``total_users`` (and no share was sent yet):
        each worker's share; otherwise nothing."""
        if self.shared or sum(users for _, users in self.users.values()) != total_users or not total_users:
            return {}
        purchases = self.purchases or total_users
        offset = 0
        for worker, (_, users) in sorted(self.users.items(), key=lambda item: item[1][0]):
            if users:
                self.shared[worker] = {
                    "offset": offset,
                    "users": total_users,
                    "purchases": purchases,
                    "local_users": users,
                }
            offset += users
        return dict(self.shared)

    def mark_ready(self, worker: str, *, opens_at: float, round: int = 0) -> bool:
        """Note ``worker`` ready for ``round``; True when this made every worker with a share ready for
        the round being prepared: the countdown to ``opens_at`` starts."""
        if worker not in self.shared or round < self.round:
            return False
        self.ready.setdefault(round, set()).add(worker)
        return self.count_down(opens_at)

    def count_down(self, opens_at: float) -> bool:
        """True (once) when every worker with a share is ready for the round being prepared."""
        if self.phase == "preparing" and self.ready.get(self.round, set()) == set(self.shared):
            self.phase, self.opens_at = "countdown", opens_at
            return True
        return False

    def open(self, at: float) -> None:
        self.phase, self.opened_at = "open", at

    def next_round(self) -> None:
        """The round is answered: keep its summary, and prepare the next one (or end)."""
        self.done.append(self.summary())
        if self.round + 1 >= self.rounds:
            self.phase = "ended"  # the last round's figures and opening stay for the progress file
            return
        self.figures = {}
        self.round += 1
        self.opens_at = self.opened_at = None
        self.phase = "preparing"

    def absorb(self, worker: str, report: dict) -> None:
        """Keep a worker's report of this round: its totals replace the previous ones, its new
        items are added. A report of another round (one sent before its round ended, or a ready
        note of the next) adds nothing."""
        if report.get("round", 0) != self.round or self.figures.get(worker, {}).get("whole"):
            return
        if report.get("whole"):
            self.figures.pop(worker, None)
        mine = self.figures.setdefault(
            worker, {**{name: [] for name in SERIES}, "server_timing": {}, "status_counts": {}, "outcomes": {}}
        )
        mine.update({name: report[name] for name in LATEST if name in report})
        for name in SERIES:
            mine[name].extend(report.get(name, []))
        for key, values in report.get("server_timing", {}).items():
            mine["server_timing"].setdefault(key, []).extend(values)

    @property
    def errors(self) -> list[str]:
        return [error for figures in self.figures.values() for error in figures.get("errors", [])]

    @property
    def finished(self) -> bool:
        if self.errors:
            return True
        return bool(self.shared) and all(self.figures.get(w, {}).get("finished") for w in self.shared)

    def progress(self) -> dict:
        reports = list(self.figures.values())
        return {
            "phase": "done" if self.finished and self.round + 1 >= self.rounds else self.phase,
            "round": self.round,
            "rounds": self.rounds,
            "opens_at": self.opens_at,
            "opened_at": self.opened_at,
            "workers": len(self.users),
            "planned_workers": len(self.shared),
            **{name: sum(r.get(name, 0) for r in reports) for name in ("prepared", "sent", "answered", "limit")},
        }

    def summary(self) -> dict:
        """This round's figures (:func:`loadtests.figures.merge` of the workers' reports)."""
        return {**merge(list(self.figures.values())), **self.progress()}

    def sale_summary(self) -> dict:
        """What the sale leaves behind: the last round's figures, with every round's under ``rounds``."""
        rounds = self.done if self.phase == "ended" else [*self.done, self.summary()]
        return {**rounds[-1], "rounds": rounds}
