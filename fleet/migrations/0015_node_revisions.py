from django.db import migrations, models

# What a reconciler pass builds a node's view from (fleet/selectors/state.py
# _NODE_VIEWED): the node's number moves when one of these does, not with the heartbeats'
# last-seen time, load and figures written again unchanged (tests/fleet/
# test_row_revisions.py checks the list against the selector's).
VIEWED = ("state", "cordoned", "draining", "approved", "memory_total_mb", "cpu_count", "spec_at")
TABLE = "fleet_node"


def _statements(vendor: str) -> list[str]:
    """As migration 0014's triggers, on an update only when a viewed column changed value.
    PostgreSQL's function llmgw_row_rev() is 0014's."""
    if vendor == "postgresql":
        moved = " OR ".join(f"OLD.{c} IS DISTINCT FROM NEW.{c}" for c in VIEWED)
        return [
            f"CREATE TRIGGER llmgw_rev_insert BEFORE INSERT ON {TABLE} "
            "FOR EACH ROW EXECUTE FUNCTION llmgw_row_rev()",
            f"CREATE TRIGGER llmgw_rev BEFORE UPDATE ON {TABLE} "
            f"FOR EACH ROW WHEN ({moved}) EXECUTE FUNCTION llmgw_row_rev()",
        ]
    moved = " OR ".join(f"OLD.{c} IS NOT NEW.{c}" for c in VIEWED)
    renumber = f"BEGIN UPDATE {TABLE} SET rev = random() WHERE rowid = NEW.rowid; END"
    return [
        f"CREATE TRIGGER llmgw_rev_insert_{TABLE} AFTER INSERT ON {TABLE} {renumber}",
        f"CREATE TRIGGER llmgw_rev_update_{TABLE} AFTER UPDATE ON {TABLE} WHEN {moved} {renumber}",
    ]


def triggers_create(apps, schema_editor):
    for sql in _statements(schema_editor.connection.vendor):
        schema_editor.execute(sql)
    # Rows already there get a number of their own.
    number = "nextval('llmgw_row_rev')" if schema_editor.connection.vendor == "postgresql" else "random()"
    schema_editor.execute(f"UPDATE {TABLE} SET rev = {number}")


def triggers_drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        drops = [f"DROP TRIGGER IF EXISTS {t} ON {TABLE}" for t in ("llmgw_rev", "llmgw_rev_insert")]
    else:
        drops = [f"DROP TRIGGER IF EXISTS llmgw_rev_{w}_{TABLE}" for w in ("insert", "update")]
    for sql in drops:
        schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0014_row_revisions"),
    ]

    operations = [
        migrations.AddField(
            model_name="node",
            name="rev",
            field=models.BigIntegerField(db_default=0, editable=False),
        ),
        migrations.RunPython(triggers_create, triggers_drop),
    ]
