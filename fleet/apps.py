from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleet"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from llmgw.core import history

        from .console.samples import fleet_sample

        history.sampler("fleet", fleet_sample)
