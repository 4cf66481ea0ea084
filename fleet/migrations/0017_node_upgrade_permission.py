from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0016_node_addresses_and_adopted_shards"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="node",
            options={
                "ordering": ["id"],
                "permissions": [
                    ("upgrade_node", "Can upgrade nodes' agents to an llmgw release")
                ],
            },
        ),
    ]
