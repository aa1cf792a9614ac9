from django.apps import AppConfig


class LoadtestsConfig(AppConfig):
    """Locust, the burst runner, the report and lockbench, and their commands."""

    name = "loadtests"
    verbose_name = "Load tests"

    def ready(self) -> None:
        from inventory.dashboard import BurstPanel, show_bursts

        from .report import base, panel

        def report_path():
            return base.LATEST_REPORT  # read at each request, so a test (or a later setting) can move it

        show_bursts(BurstPanel(charts=panel.burst_charts, report_path=report_path))
