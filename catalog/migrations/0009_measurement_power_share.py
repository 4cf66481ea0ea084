from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("catalog", "0008_measurement_watts"),
    ]

    operations = [
        migrations.AddField(
            model_name="measurement",
            name="power_share",
            field=models.FloatField(blank=True, null=True),
        ),
    ]
