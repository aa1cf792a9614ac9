from django.apps import AppConfig


class ProcessesConfig(AppConfig):
    """The private processes the project starts (Redis nodes, etcd, replica, relay) and their commands."""

    name = "processes"
    verbose_name = "Private processes"
