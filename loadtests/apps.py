from django.apps import AppConfig


class LoadtestsConfig(AppConfig):
    """Locust, the burst runner, the report and lockbench, and their commands."""

    name = "loadtests"
    verbose_name = "Load tests"
