from django.apps import AppConfig


class InventoryConfig(AppConfig):
    name = "inventory"
    verbose_name = "Flash-sale inventory"

    def ready(self) -> None:
        from . import checks, receivers, sessions  # noqa: F401  (registers the system checks and signal receivers)
