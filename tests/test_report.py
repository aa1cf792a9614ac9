"""The burst report: sentences computed from the figures, tolerance of missing keys, escaping,
refusal of bad input, the ``report`` command, and the dashboard's stored sentences and link.

``tests/burst_fixture.json`` is a made-up burst in the JSON schema (a floor row, six strategies,
an unsafe run that oversold and a Redlock run with a fault and its phases); its figures are
invented to exercise the report, not measured.
"""

from __future__ import annotations

import json
import os
import re
import stat
from io import StringIO
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from inventory.models import BurstRun
from loadtests.burst import store
from loadtests.report import base as report_base
from loadtests.report import machine as report_machine
from loadtests.report import svg
from loadtests.report.base import ReportError
from loadtests.report.page import place_locust_reports, render_report, write_report
from loadtests.report.sentences import sentence, sentences

FIXTURE = Path(__file__).with_name("burst_fixture.json")


@pytest.fixture
def burst() -> dict:
    return json.loads(FIXTURE.read_text())


def run_of(data: dict, backend: str, index: int = 0) -> dict:
    return [run for run in data["runs"] if run["backend"] == backend][index]


def articles(html: str) -> list[str]:
    return re.findall(r'<article class="strategy".*?</article>', html, re.S)


class TestSentences:
    def test_each_strategy_says_what_its_figures_show(self, burst):
        said = sentences(burst)
        assert len(said) == len(burst["runs"])
        floor, db, optimistic, redis, redlock, atomic, unsafe, faulted = said
        assert floor == "floor: 1,210 requests/s with no storage touched; every ratio in this report is against it."
        # A floor row made from the rows' own floor rounds says so (an older document's does not).
        own = sentence({**next(r for r in burst["runs"] if r["backend"] == "floor"), "floor_of": "db"})
        assert own == (
            "floor: 1,210 requests/s with no storage touched, the best floor round (on db's pods); "
            "each strategy's ratio is against the floor round on its own pods."
        )
        assert db == (
            "db: sold 100 of 100 units, none oversold; 48 database connections at peak, "
            "p99 lock wait 41 ms, 0.62× floor."
        )
        assert "1,912 conflicts" in optimistic and "311 shoppers told busy" in optimistic
        assert "p99 lock wait 88 ms" in redis and "0.50× floor" in redis
        assert atomic == "atomic: sold 100 of 100 units, none oversold; 0.73× floor."
        assert unsafe.startswith("unsafe: oversold 571 units (671 orders for 100 units)")
        assert "during kill-redlock-node: 15 shoppers told busy, p99 1,500 ms, served again 0.6 s after it" in faulted

    def test_the_sentence_follows_the_figures(self, burst):
        db = run_of(burst, "db")
        overselling = sentence({**db, "oversold": 3, "orders": 103})
        assert overselling.startswith("db: oversold 3 units (103 orders for 100 units)")
        assert "left 7 units unsold while shoppers were told sold out" in sentence({**db, "undersold": 7})
        assert "2 writes stopped only by a database constraint" in sentence({**db, "constraint_hits": 2})
        assert "12 database connections at peak" in sentence({**db, "peak_db_connections": 12})
        assert "1 database connection at peak" in sentence({**db, "peak_db_connections": 1})

    def test_a_control_that_did_not_oversell_says_so(self, burst):
        quiet = {**run_of(burst, "unsafe"), "oversold": 0, "orders": 100}
        assert sentence(quiet).startswith("unsafe: did not oversell this time")

    def test_floor_ratio_is_computed_from_the_floor_row_when_missing(self, burst):
        for run in burst["runs"]:
            run.pop("floor_ratio", None)
        assert "0.62× floor" in sentences(burst)[1]  # 750 / 1210
        del burst["runs"][0]  # no floor row: the sentence gives requests/s instead
        assert sentences(burst)[0].endswith("41 ms, 750 requests/s.")


def test_histogram_leaves_out_empty_buckets_below_the_first_filled_one_but_one():
    chart = svg.histogram_chart(
        [(1, 0), (2, 0), (5, 0), (10, 4), (20, 6)], colour="#000", percentiles={"p50": 10}, title="t", desc="d"
    )
    assert re.findall(r"<title>([^<]*) ms: ", chart) == ["2–5", "5–10", "10–20"]
    # p50 = 10 ms is the top of the second of three equal buckets: two thirds across the plot.
    x = float(re.search(r'<line class="marker" x1="([\d.]+)"', chart).group(1))
    plot_left, plot_width = 44, svg.WIDTH - 44 - 12
    assert x == pytest.approx(plot_left + plot_width * 2 / 3, abs=0.1)


class TestMissingKeys:
    def test_a_run_with_only_a_name_renders(self):
        html = render_report({"runs": [{"backend": "db"}]})
        assert sentence({"backend": "db"}) == "db: this run carries no figures."
        assert "<svg" not in html  # no empty chart that would pass for one
        assert "This run has no timeline" in html and "This run has no latency histogram" in html
        assert "The JSON does not record the command" in html and "does not describe the machine" in html
        assert ">–<" in html

    def test_figures_of_the_wrong_type_are_treated_as_missing(self, burst):
        run = run_of(burst, "db")
        run.update(
            rps="fast",
            oversold=True,
            status_counts=[1],
            server_timing=[],
            timeline="soon",
            latency_histogram_ms=[[1], ["a", 2], [5, "x"]],
            phases=[{"name": "during", "start_s": "x"}],
        )
        html = render_report(burst)
        assert "fast" not in html and "soon" not in html
        db_article = next(a for a in articles(html) if 'data-row="db"' in a)
        assert "This run has no latency histogram" in db_article and "no Server-Timing figures" in db_article

    def test_negative_figures_are_treated_as_missing(self, burst):
        """Seen with a hand-edited document: an "rps" of -812 was drawn and said as given (a bar,
        "-812 requests/s"); no figure of a run can be below 0, so it is missing, as a wrong type is."""
        negative = {"rps": -812.0, "p99_ms": -1234.0, "drain_s": -56.78, "floor_ratio": -0.91, "oversold": -7}
        run = run_of(burst, "db")
        run.update(negative, orders=-4321, status_counts={**run["status_counts"], "409": -4900})
        html = render_report(burst)
        for said in ("-812", "-1,234", "-1234", "-56.78", "-0.91", ">-7<", "-4,321", "-4321", "-4,900", "-4900"):
            assert said not in html, said
        assert sentence(run) == sentence({**run, **dict.fromkeys([*negative, "orders"], "x")})

    def test_an_empty_burst_renders(self):
        html = render_report({"runs": []})
        assert "0 runs: none." in html and "<article" not in html


class TestBadInput:
    @pytest.mark.parametrize(
        "data, message",
        [
            ([], "must be a JSON object"),
            ({}, 'no "runs" list'),
            ({"runs": {"db": {}}}, 'no "runs" list'),
            ({"runs": [3]}, "runs[0] must be an object"),
            ({"runs": [{"backend": "db"}, {"rps": 5}]}, 'runs[1] has no "row" name'),
            ({"runs": [{"backend": " "}]}, 'runs[0] has no "row" name'),
        ],
    )
    def test_refused_with_what_is_wrong(self, data, message):
        with pytest.raises(ReportError, match=re.escape(message)):
            render_report(data)


class TestPage:
    def test_every_strategy_has_charts_and_its_sentence(self, burst):
        html = render_report(burst)
        found = articles(html)
        assert len(found) == len(burst["runs"])
        for article, said in zip(found, sentences(burst), strict=False):
            assert article.count("<svg") >= 2  # timeline and histogram at least
            assert f'<p class="sentence">{said}</p>' in article.replace("&#x27;", "'")
        faulted = found[-1]
        assert 'class="phase phase-during"' in faulted and "Purchases answered per second" in faulted
        assert "<caption>Before, during and after kill-redlock-node</caption>" in faulted
        assert html.count('<li class="sentence"') == len(burst["runs"])

    def test_charts_are_labelled_for_screen_readers(self, burst):
        html = render_report(burst)
        for match in re.finditer(r'<svg [^>]*aria-labelledby="(\S+) (\S+)"[^>]*>', html):
            title, desc = match.groups()
            assert f'<title id="{title}">' in html and f'<desc id="{desc}">' in html
        assert len(re.findall(r'<svg [^>]*role="img"', html)) == html.count("<svg")

    def test_loads_nothing(self, burst):
        html = render_report(burst)
        assert not re.search(r"<(link|img|iframe|object|embed)\b", html)
        assert not re.search(r"\b(src|srcset)=", html) and "@import" not in html and "url(" not in html
        assert "<script" not in html
        links = set(re.findall(r'href="([^"]*)"', html))
        assert links and all(link.startswith("#") for link in links)
        assert set(re.findall(r"https?://[^\s\"'<]+", html)) == {"http://www.w3.org/2000/svg"}  # a namespace name

    def test_every_string_from_the_json_is_escaped(self, burst):
        evil = '<script>alert("x")</script>'
        burst["command"] = f"manage.py flashsale {evil}"
        burst["machine"]["redis"] = evil
        run = run_of(burst, "redlock", 1)
        run.update(backend=evil, fault=evil, scenario=evil, problems=[evil])
        run["phases"][1]["name"] = evil
        html = render_report(burst)
        assert "<script>alert" not in html and '"x"' not in html
        assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html

    def test_durability_of_each_strategy(self, burst):
        html = render_report(burst)
        for name in (
            "floor",
            "db",
            "optimistic",
            "redis",
            "redlock",
            "etcd",
            "atomic",
            "redis-stock",
            "local",
            "unsafe",
        ):
            assert f'<th scope="row">{name}' in html
        assert "this machine&#x27;s Redis keeps nothing across a restart" in html  # from the recorded config
        burst["machine"]["redis_persistence"] = {"save": "3600 1", "appendonly": "no"}
        assert "snapshots only (save 3600 1)" in render_report(burst)
        burst["machine"]["redis_persistence"] = {"save": "", "appendonly": "yes", "appendfsync": "always"}
        assert "append-only file on, appendfsync always" in render_report(burst)

    def test_write_report(self, burst, tmp_path):
        path = write_report(burst, tmp_path / "deep" / "report.html", command="make demo")
        assert path == (tmp_path / "deep" / "report.html").resolve() and path.read_text().startswith("<!doctype html>")
        assert [p.name for p in path.parent.iterdir()] == ["report.html"]  # no partial file left behind
        assert "<pre><code>make demo</code></pre>" in path.read_text()


class TestCommand:
    def test_writes_the_report(self, burst, tmp_path):
        out = StringIO()
        call_command("report", json_path=str(FIXTURE), out=str(tmp_path / "r.html"), stdout=out)
        assert out.getvalue().startswith(f"report: {tmp_path / 'r.html'} (")
        assert len(articles((tmp_path / "r.html").read_text())) == len(burst["runs"])

    @pytest.mark.parametrize(
        "content, message",
        [
            (None, "no such file; write one with `manage.py flashsale --json"),
            ("{not json", "not valid JSON (Expecting property name"),
            ('{"runs": [{"rps": 3}]}', 'runs[0] has no "row" name'),
            ('{"runs": []}', 'its "runs" list is empty: there is nothing to report'),
            (b"\xff\xfe", "cannot read it"),
        ],
    )
    def test_bad_json_is_refused_and_writes_nothing(self, tmp_path, content, message):
        source = tmp_path / "burst.json"
        if isinstance(content, bytes):
            source.write_bytes(content)
        elif content is not None:
            source.write_text(content)
        with pytest.raises(CommandError, match=re.escape(message)):
            call_command("report", json_path=str(source), out=str(tmp_path / "r.html"))
        assert not (tmp_path / "r.html").exists()

    def test_out_must_be_a_file(self, tmp_path):
        with pytest.raises(CommandError, match="is a folder; give a file name"):
            call_command("report", json_path=str(FIXTURE), out=str(tmp_path))

    def test_out_is_never_a_device_nor_the_json_it_reads(self, tmp_path):
        """Seen with --out /dev/full (exit 0: the device was replaced by a regular file) and with
        --out the --json itself (exit 0: the burst's JSON now held the report's HTML)."""
        fifo = tmp_path / "pipe"
        os.mkfifo(fifo)
        with pytest.raises(CommandError, match=f"--out {fifo}: is not a regular file"):
            call_command("report", json_path=str(FIXTURE), out=str(fifo))
        assert stat.S_ISFIFO(fifo.stat().st_mode)
        source = tmp_path / "burst.json"
        source.write_text(FIXTURE.read_text())
        with pytest.raises(CommandError, match="is the --json it reads: give another file"):
            call_command("report", json_path=str(source), out=str(source))
        assert source.read_text() == FIXTURE.read_text()

    def test_a_batch_or_queue_of_the_wrong_type_renders(self, burst):
        """Seen with a hand-edited document: a list as "batch" or "queue" ended in a TypeError."""
        burst["runs"][1].update(batch=[], queue=["shared"])
        assert "<!doctype html>" in render_report(burst)

    @pytest.mark.django_db
    def test_measures_the_machine_when_the_json_does_not_describe_it(self, burst, tmp_path):
        del burst["machine"]
        source = tmp_path / "burst.json"
        source.write_text(json.dumps(burst))
        call_command("report", json_path=str(source), out=str(tmp_path / "r.html"), stdout=StringIO())
        html = (tmp_path / "r.html").read_text()
        assert re.search(r"<dt>PostgreSQL</dt><dd>PostgreSQL \d+", html)
        assert re.search(r"<dt>Redis</dt><dd>\d+\.\d+", html)
        assert "<dt>Measured</dt><dd>when the report was written: CPU cores, Memory, OS, Python" in html

    @pytest.mark.django_db
    def test_completes_a_partly_recorded_machine(self, burst, tmp_path):
        burst["machine"] = {"cpus": 64, "platform": "Plan 9", "python": "3.11.0"}  # what the runner records
        source = tmp_path / "burst.json"
        source.write_text(json.dumps(burst))
        call_command("report", json_path=str(source), out=str(tmp_path / "r.html"), stdout=StringIO())
        html = (tmp_path / "r.html").read_text()
        assert "<dt>CPU cores</dt><dd>64</dd>" in html and "<dt>OS</dt><dd>Plan 9</dd>" in html
        assert html.count("<dt>CPU cores</dt>") == 1 and "<dd>3.11.0</dd>" in html
        assert re.search(r"<dt>PostgreSQL</dt><dd>PostgreSQL \d+", html)
        assert "<dt>Measured</dt><dd>when the report was written: Memory, Django, PostgreSQL, Redis, " in html


@pytest.mark.django_db
def test_machine_info_asks_the_real_services():
    info = report_machine.machine_info()
    assert info["cores"] >= 1 and info["memory_bytes"] > 2**20
    assert info["postgresql"].startswith("PostgreSQL ")
    assert re.fullmatch(r"\d+\.\d+\.\d+", info["redis"])
    assert set(info["redis_persistence"]) == {"save", "appendonly", "appendfsync"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", info["etcd"]) or info["etcd"] == "not installed"
    assert info["python"].startswith("3.") and info["django"].startswith("5.")


class TestDashboard:
    @pytest.fixture
    def staff(self, client, admin_user, private_static_root):
        client.force_login(admin_user)
        return client

    @pytest.fixture
    def latest(self, monkeypatch, tmp_path):
        path = tmp_path / "report.html"
        monkeypatch.setattr(report_base, "LATEST_REPORT", path)
        return path

    @pytest.fixture
    def stored(self, db, burst) -> list[dict]:
        """The fixture's audited runs, stored as ``flashsale`` stores them (the floor is not)."""
        runs = [run for run in burst["runs"] if run["backend"] != "floor"]
        started = timezone.now()
        for run in runs:
            row = {**run, "row": run["backend"]}  # the fixture is a document from before the key's rename
            store(row, plan=SimpleNamespace(sku="phone-x"), figures={"timeline": run["timeline"]}, started_at=started)
        return runs

    def test_shows_the_latest_bursts_stored_sentences(self, staff, latest, burst, stored):
        older = BurstRun.objects.create(**{**BurstRun.objects.values().first(), "id": None, "sentence": "an old one"})
        BurstRun.objects.filter(pk=older.pk).update(started_at=timezone.now() - timezone.timedelta(days=1))
        assert [run.sentence for run in BurstRun.objects.order_by("id")][:-1] == [sentence(r) for r in stored]
        html = staff.get("/admin/dashboard/").content.decode()
        for run in stored:
            assert sentence(run).replace("'", "&#x27;") in html
        assert "an old one" not in html
        assert html.count('<li class="bad">') == 1  # the unsafe run broke its invariant
        assert 'href="/admin/dashboard/report/"' not in html  # no report file to open

    def test_links_the_report_file_but_does_not_read_it(self, staff, latest, burst, stored):
        said = sentence(stored[0])
        burst["runs"][1]["oversold"] = 99  # the file now says something else than the stored runs
        write_report(burst, latest)
        assert "oversold 99" in latest.read_text()
        html = staff.get("/admin/dashboard/").content.decode()
        assert 'href="/admin/dashboard/report/"' in html
        assert said in html and "oversold 99" not in html

    def test_serves_the_report_so_it_can_load_nothing(self, staff, latest, burst):
        write_report(burst, latest)
        response = staff.get("/admin/dashboard/report/")
        assert response.status_code == 200 and response["Content-Type"] == "text/html; charset=utf-8"
        assert response["Content-Security-Policy"].startswith("default-src 'none'")
        assert b"".join(response.streaming_content) == latest.read_bytes()

    def test_without_a_report(self, staff, latest, burst):
        write_report(burst, latest)  # a file, but no burst stored: nothing to say
        assert 'id="latest-report"' not in staff.get("/admin/dashboard/").content.decode()
        latest.unlink()
        assert staff.get("/admin/dashboard/report/").status_code == 404

    def test_staff_only(self, client, latest, burst, django_user_model, private_static_root):
        write_report(burst, latest)
        assert client.get("/admin/dashboard/report/")["Location"].startswith("/admin/login/")
        client.force_login(django_user_model.objects.create_user("clerk", password="pw-12345678", is_staff=True))
        assert client.get("/admin/dashboard/report/").status_code == 403


def test_locust_reports_are_copied_beside_the_report_and_linked(burst, tmp_path):
    made = tmp_path / "run" / "db-20261201-120000"
    made.parent.mkdir()
    Path(f"{made}.html").write_text("<html>locust</html>")
    Path(f"{made}_stats.csv").write_text("Type,Name\n")
    runs = burst["runs"]
    runs[1].update(locust_report=f"{made}.html", balancer="haproxy", locust_workers=2)
    runs[2]["locust_report"] = str(tmp_path / "gone.html")

    place_locust_reports(runs, tmp_path / "artifacts" / "report.html")

    assert runs[1]["locust_report"] == "locust/db-20261201-120000.html" and runs[2]["locust_report"] is None
    copied = tmp_path / "artifacts" / "locust"
    assert sorted(p.name for p in copied.iterdir()) == ["db-20261201-120000.html", "db-20261201-120000_stats.csv"]
    html = articles(render_report(burst))[1]
    assert 'href="locust/db-20261201-120000.html"' in html and "Locust master + 2 workers" in html
    assert "through haproxy" in html and 'href="locust/' not in articles(render_report(burst))[2]
