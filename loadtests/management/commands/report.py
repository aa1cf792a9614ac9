"""``manage.py report``: render a burst's JSON as the self-contained HTML report."""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from loadtests.options import check_output
from loadtests.report.base import DEFAULT_JSON, LATEST_REPORT, ReportError, validate
from loadtests.report.machine import complete_machine
from loadtests.report.page import write_report


class Command(BaseCommand):
    help = (
        "Write the HTML report of a burst (manage.py flashsale --json): one file, no network, a chart set "
        "and one sentence per strategy. What the JSON does not record of the machine (versions of PostgreSQL, "
        "Redis, etcd...) is measured here."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--json",
            dest="json_path",
            default=str(DEFAULT_JSON),
            help=f"the burst JSON to read (default {DEFAULT_JSON})",
        )
        parser.add_argument(
            "--out",
            default=str(LATEST_REPORT),
            help=f"where to write the report (default {LATEST_REPORT}, the one the admin links)",
        )

    def handle(self, *args, json_path: str, out: str, **options):
        source = Path(json_path)
        try:
            text = source.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise CommandError(
                f"--json {json_path}: no such file; write one with `manage.py flashsale --json {json_path}`"
            ) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"--json {json_path}: cannot read it ({exc})") from exc
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise CommandError(
                f"--json {json_path}: not valid JSON ({exc}); write it with manage.py flashsale --json"
            ) from exc
        target = Path(out)
        if target.is_dir():
            raise CommandError(f"--out {out}: is a folder; give a file name such as {target / 'report.html'}")
        if target.resolve() == source.resolve():
            raise CommandError(f"--out {out}: is the --json it reads: give another file")
        check_output("--out", out)
        try:
            runs = validate(data)
        except ReportError as exc:
            raise CommandError(f"--json {json_path}: {exc}") from exc
        if not runs:
            # A page that says "0 runs: none." would pass for a report; a burst always records a row.
            raise CommandError(
                f'--json {json_path}: its "runs" list is empty: there is nothing to report; '
                "write one with manage.py flashsale --json"
            )
        data = {**data, "machine": complete_machine(data.get("machine"))}
        try:
            path = write_report(data, target)
        except OSError as exc:
            raise CommandError(f"--out {out}: cannot write it ({exc.strerror or exc})") from exc
        self.stdout.write(f"report: {path} ({path.stat().st_size:,} bytes)")
