"""``manage.py purchasecost``: per-request cost of the floor and the purchase view, in child processes."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from inventory.models import Order, Product
from loadtests.cost import PROBE_PREFIX


def cpu_counts(*args: str) -> list[str]:
    """The lines ``purchasecost --counter cpu`` prints with ``args``."""
    out = StringIO()
    call_command("purchasecost", "--counter", "cpu", *args, stdout=out, stderr=StringIO())
    return out.getvalue().splitlines()


@pytest.mark.slow  # four child processes, each a Django start
@pytest.mark.django_db(transaction=True)
def test_cpu_counter_prints_a_row_per_strategy_and_leaves_nothing_behind():
    lines = cpu_counts("--strategies", "db,atomic", "--requests", "16")
    assert lines[0].startswith("per request, CPU ms of this process (16 requests a case, cpu)")
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert set(rows) == {"db", "atomic"}
    for floor, purchase, ratio in rows.values():
        assert float(floor) > 0 and float(purchase) > 0
        assert float(ratio) == pytest.approx(float(floor) / float(purchase), abs=0.02)
    # The children bought from a probe product of their own, in this database, and removed it.
    assert not Product.objects.filter(sku__startswith=PROBE_PREFIX).exists() and not Order.objects.exists()


@pytest.mark.slow  # two child processes, each a Django start
@pytest.mark.django_db(transaction=True)
def test_a_control_is_counted_as_flashsale_runs_it(monkeypatch):
    """Seen by a helper: ``--strategies unsafe`` (a strategy the command offers) printed the table's head,
    then "unsafe floor: the child failed (HINT: use db, optimistic, ...)": the child refused to load a
    control without ALLOW_UNSAFE_STRATEGY=1, which flashsale sets for its controls' pods only."""
    monkeypatch.delenv("ALLOW_UNSAFE_STRATEGY", raising=False)
    monkeypatch.delenv("ALLOW_UNSAFE_BACKEND", raising=False)
    out = StringIO()
    call_command(
        "purchasecost", "--counter", "cpu", "--strategies", "unsafe", "--requests", "4", stdout=out, stderr=StringIO()
    )
    lines = out.getvalue().splitlines()
    assert [line.split()[0] for line in lines[2:]] == ["unsafe"]
    assert not Product.objects.filter(sku__startswith=PROBE_PREFIX).exists() and not Order.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_bad_arguments_are_one_line_errors():
    with pytest.raises(CommandError, match=r"^--strategies 'nosuch' is not a strategy: use one of db, "):
        call_command("purchasecost", "--counter", "cpu", "--strategies", "nosuch", stdout=StringIO(), stderr=StringIO())
    with pytest.raises(CommandError, match="--requests must be at least 1"):
        call_command("purchasecost", "--requests", "0", stdout=StringIO(), stderr=StringIO())
    with pytest.raises(CommandError, match="--batch must be at least 1"):
        call_command("purchasecost", "--batch", "0", stdout=StringIO(), stderr=StringIO())
    with pytest.raises(CommandError, match=r"^--requests must be a multiple of --batch \(each of the 16 shoppers"):
        call_command("purchasecost", "--requests", "100", "--batch", "16", stdout=StringIO(), stderr=StringIO())


@pytest.mark.slow  # two child processes, each a Django start and four shopper threads
@pytest.mark.django_db(transaction=True)
def test_batch_sends_from_as_many_shoppers_and_says_the_section_size():
    lines = cpu_counts("--strategies", "atomic", "--requests", "32", "--batch", "4")
    assert lines[0] == "per request, CPU ms of this process (32 requests a case, 4 shoppers, BATCH=4, cpu)"
    assert lines[1].split() == ["strategy", "floor", "purchase", "floor/purchase", "section"]
    name, floor, purchase, ratio, section = lines[2].split()
    assert name == "atomic" and float(floor) > 0 and float(purchase) > 0
    assert float(ratio) == pytest.approx(float(floor) / float(purchase), abs=0.02)
    # The mean size of the sections the purchases were served in, from their Server-Timing: above
    # one, so BATCH=4 reached the child and its shoppers ran at once (4.0 in five runs of five: a
    # leader after a shared section lingers for company), and never more than the four shoppers.
    assert 1.0 < float(section) <= 4.0
    assert not Product.objects.filter(sku__startswith=PROBE_PREFIX).exists() and not Order.objects.exists()
