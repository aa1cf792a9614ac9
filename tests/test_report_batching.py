"""The report's batching section: computed from a strategy's BATCH=1 row and its batched row."""

from __future__ import annotations

from loadtests.report.batching import batching_sentence
from loadtests.report.page import render_report


def row(backend: str, *, batch: int, rps: float, sections: int | None, drain_s: float, locked: bool = True) -> dict:
    return {
        "row": backend,
        "batch": batch,
        "requests": 3000,
        "rps": rps,
        "sections": sections,
        "drain_s": drain_s,
        "batch_p50": batch if batch > 1 else 1,
        "p99_ms": 900.0,
        "server_timing": {"lock_wait_ms": {"p50": 3.0, "p99": 9.0} if locked else None},
        "invariants_ok": True,
    }


def test_the_sentence_says_purchases_per_acquisition_and_the_gain():
    alone = row("redis", batch=1, rps=100.0, sections=3000, drain_s=30.0)
    batched = row("redis", batch=64, rps=620.0, sections=73, drain_s=4.8)
    assert batching_sentence(alone, batched) == (
        "redis ×64: 41 purchases per lock acquisition, 6.20× the same lock one purchase at a time"
    )
    unguarded = row("atomic", batch=64, rps=300.0, sections=300, drain_s=10.0, locked=False)
    assert batching_sentence(
        row("atomic", batch=1, rps=150.0, sections=3000, drain_s=20.0, locked=False), unguarded
    ) == ("atomic ×64: 10 purchases per transaction, 2.00× the same strategy one purchase at a time")
    assert batching_sentence(alone, {**batched, "sections": None}) is None


def test_the_section_appears_only_with_a_strategy_run_both_ways():
    floor = {"row": "floor", "batch": 1, "rps": 1000.0, "requests": 3000}
    alone = row("redis", batch=1, rps=100.0, sections=3000, drain_s=30.0)
    batched = row("redis", batch=64, rps=620.0, sections=73, drain_s=4.8)
    html = render_report({"runs": [floor, alone, batched]})
    assert 'id="batching"' in html and "41 purchases per lock acquisition" in html
    assert "redis ×64" in html
    assert 'id="batching"' not in render_report({"runs": [floor, alone]})
