from django.apps import AppConfig


class FaultsConfig(AppConfig):
    """Faults injected into the project's own processes, and the narrated simulate_* demos."""

    name = "faults"
    verbose_name = "Faults and demos"
