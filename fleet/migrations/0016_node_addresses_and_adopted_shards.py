import importlib

from django.db import migrations, models

REBUILT = ("fleet_node", "fleet_shard")


def second_shards_drop(apps, schema_editor):
    """Before one shard per (replica, rank) is enforced: a node could once attach a shard of
    its own to another node's replica (`<replica>-00` parsed as rank 0). Of each such pair
    the shard the control plane placed (its id as the control plane makes it,
    `<replica>-<rank>`) stays; the other is dropped, and its node's next register is told
    to stop it."""
    Shard = apps.get_model("fleet", "Shard")
    seen: dict[tuple[str, int], list[str]] = {}
    for shard_id, replica_id, rank in Shard.objects.order_by("id").values_list(
        "id", "replica_id", "rank"
    ):
        seen.setdefault((replica_id, rank), []).append(shard_id)
    dropped = []
    for (replica_id, rank), ids in seen.items():
        if len(ids) > 1:
            placed = f"{replica_id}-{rank}"
            keep = placed if placed in ids else ids[0]
            dropped += [i for i in ids if i != keep]
    if dropped:
        Shard.objects.filter(pk__in=dropped).delete()


def triggers_again(apps, schema_editor):
    """SQLite rebuilds a table to add a constraint or a column, and the rebuild drops its
    triggers: those of migrations 0014 (shards) and 0015 (nodes) are made again."""
    if schema_editor.connection.vendor != "sqlite":
        return
    for table in REBUILT:
        for when in ("insert", "update"):
            schema_editor.execute(f"DROP TRIGGER IF EXISTS llmgw_rev_{when}_{table}")
    rows = importlib.import_module("fleet.migrations.0014_row_revisions")
    nodes = importlib.import_module("fleet.migrations.0015_node_revisions")
    for sql in rows._statements("sqlite"):
        if sql.split(" ON ", 1)[1].startswith("fleet_shard "):
            schema_editor.execute(sql)
    for sql in nodes._statements("sqlite"):
        schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0015_node_revisions"),
    ]

    operations = [
        migrations.AddField(
            model_name="node",
            name="address_refusal",
            field=models.CharField(blank=True, max_length=500),
        ),
        migrations.AddField(
            model_name="node",
            name="approved_addr",
            field=models.CharField(blank=True, max_length=255),
        ),
        migrations.AddField(
            model_name="node",
            name="seen_addr",
            field=models.CharField(blank=True, max_length=255),
        ),
        migrations.AddField(
            model_name="shard",
            name="adopted_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(second_shards_drop, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="shard",
            constraint=models.UniqueConstraint(
                fields=("replica", "rank"), name="shard_rank_unique"
            ),
        ),
        migrations.RunPython(triggers_again, migrations.RunPython.noop),
    ]
