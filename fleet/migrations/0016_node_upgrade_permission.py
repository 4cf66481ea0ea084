from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0015_node_revisions"),
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
