"""The code says "strategy"; the older word "backend" is still accepted where users typed it:
the environment, ``settings.INVENTORY``, and the commands' options; and a burst JSON written
before the rename (its rows' ``backend`` key, now ``row``) still makes a report. An order's and a
burst run's column is ``strategy`` (docs/operations.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from faults.management.commands.simulate_pause import Command as SimulatePause
from inventory.strategies import configured_name
from loadtests.management.commands.flashsale import Command as Flashsale

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "config, name",
    [
        ({"STRATEGY": "redis"}, "redis"),
        ({"BACKEND": "redis"}, "redis"),
        ({"STRATEGY": "redis", "BACKEND": "redis"}, "redis"),
        ({}, "db"),
    ],
)
def test_settings_name_the_strategy_by_either_word(config, name):
    assert configured_name(config) == name


def test_two_different_names_are_refused():
    with pytest.raises(ImproperlyConfigured, match="STRATEGY='redis' and BACKEND='db' .*keep STRATEGY"):
        configured_name({"STRATEGY": "redis", "BACKEND": "db"})


OLD_AND_NEW = {"INVENTORY_STRATEGY", "INVENTORY_BACKEND", "ALLOW_UNSAFE_STRATEGY", "ALLOW_UNSAFE_BACKEND"}


@pytest.mark.slow  # starts Django in a process of its own per case: make test runs it, make check does not
@pytest.mark.parametrize(
    "env, expected",
    [
        ({"INVENTORY_STRATEGY": "unsafe", "ALLOW_UNSAFE_STRATEGY": "1"}, ["unsafe", "True"]),
        ({"INVENTORY_BACKEND": "unsafe", "ALLOW_UNSAFE_BACKEND": "1"}, ["unsafe", "True"]),
        ({"INVENTORY_STRATEGY": "etcd", "INVENTORY_BACKEND": "redlock"}, ["etcd", "False"]),
    ],
)
def test_the_environment_names_the_strategy_by_either_word(env, expected):
    """The settings module read in a fresh process, as gunicorn reads it."""
    show = "from django.conf import settings as s; print(s.INVENTORY['STRATEGY'], s.INVENTORY['ALLOW_UNSAFE'])"
    shown = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {show}"],
        cwd=ROOT,
        env={
            **{k: v for k, v in os.environ.items() if k not in OLD_AND_NEW},
            "DJANGO_SETTINGS_MODULE": "shop.settings",
            **env,
        },
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert shown == expected


@pytest.mark.parametrize("flag", ["--strategies", "--backends"])
def test_flashsale_takes_either_option(flag):
    parser = Flashsale().create_parser("manage.py", "flashsale")
    assert parser.parse_args([flag, "db,redis"]).strategies == "db,redis"


@pytest.mark.parametrize("flag", ["--strategy", "--backend"])
def test_simulate_pause_takes_either_option(flag):
    parser = SimulatePause().create_parser("manage.py", "simulate_pause")
    assert parser.parse_args([flag, "etcd"]).strategy == "etcd"


def test_a_burst_document_from_before_the_rename_still_makes_a_report():
    from loadtests.report.page import render_report
    from loadtests.report.sentences import sentences

    old = {"runs": [{"backend": "floor", "rps": 1000.0}, {"backend": "db", "rps": 500.0, "requests": 10}]}
    new = {"runs": [{"row": "floor", "rps": 1000.0}, {"row": "db", "rps": 500.0, "requests": 10}]}
    assert sentences(old) == sentences(new) and "db:" in sentences(old)[1]
    charts = re.compile(r"chart\d+")  # every rendered chart takes the next id
    assert charts.sub("chart", render_report(old)) == charts.sub("chart", render_report(new))
