from django.db import migrations

# Adding a build was `add_enginebuild`, which the operators group held; now it is
# `push_enginebuild`, which release managers hold (llmgw/core/permissions.py). The old
# permissions are deleted, not left held by operators as if they still allowed something.
STALE = ("add_enginebuild", "change_enginebuild")


def stale_delete(apps, schema_editor):
    Permission = apps.get_model("auth", "Permission")
    Permission.objects.using(schema_editor.connection.alias).filter(
        content_type__app_label="mirror", codename__in=STALE
    ).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("mirror", "0003_engine_build"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="enginebuild",
            options={
                "default_permissions": ("view", "delete"),
                "ordering": ["engine", "platform", "-added_at", "-pk"],
                "permissions": [
                    ("push_enginebuild", "Can push engine builds and llmgw releases to nodes")
                ],
            },
        ),
        migrations.RunPython(stale_delete, migrations.RunPython.noop),
    ]
