# The first table was never written to: replaced by weights and their files.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("mirror", "0001_initial"),
    ]

    operations = [
        migrations.DeleteModel(name="WeightFile"),
        migrations.CreateModel(
            name="Weights",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("source", models.CharField(max_length=500, unique=True)),
                ("sha256", models.CharField(blank=True, max_length=64)),
                ("added_by", models.CharField(max_length=64)),
                ("added_at", models.DateTimeField()),
                ("last_used_at", models.DateTimeField(blank=True, null=True)),
                ("revision", models.CharField(blank=True, max_length=100)),
            ],
            options={"ordering": ["id"], "verbose_name_plural": "weights"},
        ),
        migrations.CreateModel(
            name="WeightFile",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("path", models.CharField(max_length=500)),
                ("fetch_url", models.CharField(max_length=1000)),
                ("size", models.PositiveBigIntegerField(blank=True, null=True)),
                ("expected_sha256", models.CharField(blank=True, max_length=64)),
                ("sha256", models.CharField(blank=True, db_index=True, max_length=64)),
                ("state", models.CharField(choices=[("queued", "queued"), ("downloading", "downloading"), ("ready", "ready"), ("failed", "failed")], default="queued", max_length=16)),
                ("detail", models.TextField(blank=True)),
                ("bytes_done", models.PositiveBigIntegerField(default=0)),
                ("attempts", models.PositiveIntegerField(default=0)),
                ("next_try_at", models.DateTimeField(blank=True, null=True)),
                ("claimed_until", models.DateTimeField(blank=True, null=True)),
                ("weights", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="files", to="mirror.weights")),
            ],
            options={"ordering": ["weights_id", "path"]},
        ),
        migrations.AddConstraint(
            model_name="weightfile",
            constraint=models.UniqueConstraint(fields=("weights", "path"), name="mirror_file_path_once"),
        ),
    ]
