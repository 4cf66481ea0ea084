"""The weights store: files kept once per cluster."""

from django.db import models


class WeightFile(models.Model):
    """One weights file: where it came from, its digest, and how far its download got."""

    STATES = [
        ("queued", "queued"),
        ("downloading", "downloading"),
        ("ready", "ready"),
        ("failed", "failed"),
    ]

    source = models.CharField(max_length=500, unique=True)
    filename = models.CharField(max_length=300)
    size = models.PositiveBigIntegerField(null=True, blank=True)
    downloaded = models.PositiveBigIntegerField(default=0)
    sha256 = models.CharField(max_length=64, blank=True)
    state = models.CharField(max_length=16, choices=STATES, default="queued")
    detail = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["source"]

    def __str__(self) -> str:
        return self.source
