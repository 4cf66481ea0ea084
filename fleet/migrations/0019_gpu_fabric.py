# Each GPU's fabric report and an operator's cordon, each node's IMEX and InfiniBand ports
# (fleet/agent/fabric.py reads them, fleet/nodes/reports.py records them). Only nullable
# columns on fleet_node: SQLite adds them in place, keeping migration 0015's triggers.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0018_event"),
    ]

    operations = [
        migrations.AddField(
            model_name="gpu",
            name="cordoned",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="gpu",
            name="fabric",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="node",
            name="ib_ports",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="node",
            name="fabric_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="node",
            name="imex",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
