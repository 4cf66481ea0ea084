from django.db import migrations


class Migration(migrations.Migration):
    """The event log's row is an Event, as it is everywhere else (was EventRecord)."""

    dependencies = [("fleet", "0017_node_upgrade_permission")]

    operations = [migrations.RenameModel(old_name="EventRecord", new_name="Event")]
