"""The combining queue with real threads (the generated ``Combiner``) and with the tasks of one event
loop (its asyncio source, ``AsyncCombiner``): one answer per request, busy within the timeout, FIFO batches."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import pytest

from inventory.combining import AsyncCombiner, Combiner, Ticket
from tests.helpers import run_threads


def busy(ticket) -> str:
    return "busy"


def test_every_request_gets_its_own_answer_once_in_arrival_order():
    combiner = Combiner(limit=8)
    answers, served, sizes = {}, [], Counter()
    lock = threading.Lock()

    def serve(take) -> None:
        tickets = take()
        sizes[len(tickets)] += 1
        time.sleep(0.002)  # a section's work, so others queue meanwhile
        for ticket in tickets:
            served.append(ticket.item)
            combiner.answer(ticket, ("done", ticket.item))

    def submitter(index: int) -> None:
        for n in range(40):
            item = (index, n)
            ticket = combiner.submit(item, serve=serve, timeout_s=10, busy=busy)
            with lock:
                assert item not in answers
                answers[item] = ticket.answer

    run_threads(12, submitter, timeout_s=30)
    assert answers == {(i, n): ("done", (i, n)) for i in range(12) for n in range(40)}
    assert sorted(served) == sorted(answers), "a request was served twice or not at all"
    for index in range(12):  # each thread's requests were served in the order it made them
        mine = [n for i, n in served if i == index]
        assert mine == sorted(mine)
    assert max(sizes) > 1 and max(sizes) <= 8


def test_waiters_behind_a_stalled_leader_are_answered_busy_within_their_timeout():
    combiner = Combiner(limit=8)
    stalled, resume = threading.Event(), threading.Event()
    taken_by_leader, resumed = [], []

    def serve(take) -> None:
        stalled.set()
        resumed.append(resume.wait(30))  # e.g. waiting for the lock, or paused
        tickets = take()
        taken_by_leader.extend(ticket.item for ticket in tickets)
        for ticket in tickets:
            combiner.answer(ticket, "served")

    leader_answer = []
    leader = threading.Thread(
        target=lambda: leader_answer.append(combiner.submit("leader", serve=serve, timeout_s=10, busy=busy).answer)
    )
    leader.start()
    assert stalled.wait(5)
    waited, answers = {}, {}

    def waiter(index: int) -> None:
        started = time.monotonic()
        answers[index] = combiner.submit(f"w{index}", serve=serve, timeout_s=0.3, busy=busy).answer
        waited[index] = time.monotonic() - started

    run_threads(5, waiter, timeout_s=30)
    assert answers == dict.fromkeys(range(5), "busy")
    assert all(seconds >= 0.3 for seconds in waited.values()), waited  # each waited out its own timeout
    resume.set()
    leader.join(5)
    # ... and was answered while the leader was still stalled: it is let go only now (not by its own timeout).
    assert resumed == [True]
    assert leader_answer == ["served"]
    assert taken_by_leader == ["leader"], "a leader took a waiter that had already been answered busy"
    assert combiner.submit("after", serve=serve, timeout_s=1, busy=busy).answer == "served"


def test_a_leader_failing_before_its_commit_answers_its_batch_busy_and_passes_the_lead_on():
    """True only before a commit (nothing of the batch written): after one, inventory.batched
    answers each purchase itself (tests/test_batching.py: a committed batch answers truly)."""
    combiner = Combiner(limit=4)
    failing = [True]

    def serve(take) -> None:
        tickets = take()
        if failing[0]:
            failing[0] = False
            raise RuntimeError("the database went away")
        for ticket in tickets:
            combiner.answer(ticket, "served")

    assert combiner.submit("first", serve=serve, timeout_s=1, busy=busy).answer == "busy"
    assert combiner.submit("second", serve=serve, timeout_s=1, busy=busy).answer == "served"


def test_a_lingering_leader_starts_once_as_many_are_queued_as_the_largest_recent_batch():
    """Group commit's wait (``Combiner.linger``): after batches of 4 and then 2 it ends when four are
    queued, the largest of the recent batches, not two (a closed loop's shoppers come back in the
    group they were served in, and a batch cut at the last one's size splits them for good); with
    fewer it lasts the whole linger."""
    combiner = Combiner(limit=8)
    combiner.note_batch(4)
    combiner.note_batch(2)
    batches: list[tuple[int, float]] = []

    def serve(take) -> None:
        started = time.monotonic()
        combiner.linger(1.0)
        tickets = take()
        batches.append((len(tickets), time.monotonic() - started))
        for ticket in tickets:
            combiner.answer(ticket, "done")

    def shopper(index: int) -> None:
        time.sleep(0.1 * index)  # the first leads; the others queue 0.1 s apart
        assert combiner.submit(index, serve=serve, timeout_s=10, busy=busy).answer == "done"

    run_threads(4, shopper, timeout_s=10)
    [(size, waited)] = batches
    assert size == 4 and 0.25 < waited < 0.8, batches
    combiner.submit("alone", serve=serve, timeout_s=10, busy=busy)
    assert batches[1][0] == 1 and batches[1][1] >= 0.95, "nobody came: the whole linger"


def test_a_ticket_is_never_answered_twice():
    combiner = Combiner(limit=2)
    errors = []

    def serve(take) -> None:
        (ticket,) = take()
        combiner.answer(ticket, "one")
        try:
            combiner.answer(ticket, "two")
        except RuntimeError as exc:
            errors.append(str(exc))

    assert combiner.submit("x", serve=serve, timeout_s=1, busy=busy).answer == "one"
    assert errors and "cannot be answered" in errors[0]


def test_a_combiner_serves_at_least_one_per_batch():
    with pytest.raises(ValueError):
        Combiner(limit=0)


def test_the_tasks_of_one_loop_get_one_answer_each_in_arrival_order():
    """The asyncio source: 12 tasks submit 40 requests each; a section yields to the loop (as the
    ORM thread's await does), so the others queue behind the leader meanwhile."""
    combiner = AsyncCombiner(limit=8)
    answers, served, sizes = {}, [], Counter()

    async def serve(take) -> None:
        tickets = await take()  # a shared queue's take awaits Redis
        sizes[len(tickets)] += 1
        await asyncio.sleep(0.002)
        for ticket in tickets:
            served.append(ticket.item)
            combiner.answer(ticket, ("done", ticket.item))

    async def submitter(index: int) -> None:
        for n in range(40):
            ticket = await combiner.submit((index, n), serve=serve, timeout_s=10, busy=busy)
            assert (index, n) not in answers
            answers[index, n] = ticket.answer

    async def sale() -> None:
        await asyncio.wait_for(asyncio.gather(*(submitter(i) for i in range(12))), 30)

    asyncio.run(sale())
    assert answers == {(i, n): ("done", (i, n)) for i in range(12) for n in range(40)}
    assert sorted(served) == sorted(answers)
    for index in range(12):
        mine = [n for i, n in served if i == index]
        assert mine == sorted(mine)
    assert max(sizes) > 1 and max(sizes) <= 8
    assert combiner.idle


def test_tasks_behind_a_stalled_leader_on_the_loop_are_answered_busy_within_their_timeout():
    combiner = AsyncCombiner(limit=8)
    taken_by_leader = []

    async def sale() -> tuple:
        stalled, resume = asyncio.Event(), asyncio.Event()

        async def serve(take) -> None:
            stalled.set()
            await resume.wait()  # waiting for the lock, on the loop
            tickets = await take()  # a shared queue's take awaits Redis
            taken_by_leader.extend(ticket.item for ticket in tickets)
            for ticket in tickets:
                combiner.answer(ticket, "served")

        leader = asyncio.create_task(combiner.submit("leader", serve=serve, timeout_s=10, busy=busy))
        await stalled.wait()
        started = time.monotonic()
        waiters = await asyncio.gather(
            *(combiner.submit(f"w{i}", serve=serve, timeout_s=0.3, busy=busy) for i in range(5))
        )
        waited = time.monotonic() - started
        resume.set()
        after = await combiner.submit("after", serve=serve, timeout_s=1, busy=busy)
        return (await leader).answer, [w.answer for w in waiters], waited, after.answer

    leader, waiters, waited, after = asyncio.run(sale())
    assert waiters == ["busy"] * 5 and waited >= 0.3
    assert leader == "served" and after == "served"
    assert taken_by_leader == ["leader", "after"], "a leader took a waiter that had already been answered busy"
    assert combiner.idle


def test_a_tickets_event_is_set_once_cleared_and_wakes_its_waiting_thread():
    """The blocking twin's ticket event (one lock, not threading.Event's Condition): a wait after a
    set returns at once, a second set changes nothing, a clear makes the next wait time out, and a
    set from another thread wakes a thread already waiting."""
    event = Ticket("item").event
    assert not event.is_set() and event.wait(0.01) is False
    event.set()
    event.set()  # the leader may answer a ticket it also promoted: still one set
    assert event.is_set() and event.wait(0) is True and event.wait(None) is True
    event.clear()
    event.clear()
    started = time.monotonic()
    assert event.wait(0.05) is False and time.monotonic() - started >= 0.04
    woke = []
    waiter = threading.Thread(target=lambda: woke.append(event.wait(5.0)))
    waiter.start()
    time.sleep(0.02)
    started = time.monotonic()
    event.set()
    waiter.join(5.0)
    assert woke == [True] and time.monotonic() - started < 1.0
