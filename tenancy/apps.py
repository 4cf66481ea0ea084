from django.apps import AppConfig
from django.db.models.signals import post_migrate


class TenancyConfig(AppConfig):
    name = "tenancy"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from llmgw.core.permissions import groups_after_migrate

        # The viewers and operators groups (llmgw/core/permissions.py): after each migrate, as
        # Django makes permissions then, not in a migration, before they exist.
        post_migrate.connect(groups_after_migrate, sender=self, dispatch_uid="llmgw.groups")
