from django.apps import AppConfig


class LoadtestsConfig(AppConfig):
    """Locust, the burst runner, the report and lockbench, and their commands."""

    name = "loadtests"
    verbose_name = "Load tests"

    def ready(self) -> None:
        from inventory.dashboard import ReportSource, show_latest_report

        from .report import base, page

        # The path is read at each request, so a test (or a later setting) can move it.
        show_latest_report(ReportSource(path=lambda: base.LATEST_REPORT, read_summary=page.read_summary))
