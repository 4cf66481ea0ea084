"""Weights kept once per cluster: what an operator added, and the files it is made of."""

from django.db import models

from .domain.progress import QUEUED, STATES


class Weights(models.Model):
    """Weights an operator added by source; its files are fetched by the mirror's worker.

    Its state is derived from its files (mirror.domain.progress), never stored.
    """

    source = models.CharField(max_length=500, unique=True)
    # The digest the operator gave for a single-file source; the hub's own digests
    # of LFS files are kept per file.
    sha256 = models.CharField(max_length=64, blank=True)
    added_by = models.CharField(max_length=64)
    added_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)
    # The revision a hub source resolved to when added, so every file is of one commit.
    revision = models.CharField(max_length=100, blank=True)

    class Meta:
        ordering = ["id"]
        verbose_name_plural = "weights"

    def __str__(self) -> str:
        return self.source


class WeightFile(models.Model):
    """One file of some weights: where it is fetched from, how far, and its verified digest.

    ``expected_sha256`` is what the hub (or the operator) says the file's digest is;
    ``sha256`` is set only once the bytes were hashed and matched, and names the
    blob the mirror serves. A file is claimed by one worker at a time
    (``claimed_until``), so one download runs per file however many ask for it.
    """

    weights = models.ForeignKey(Weights, on_delete=models.CASCADE, related_name="files")
    path = models.CharField(max_length=500)
    fetch_url = models.CharField(max_length=1000)
    size = models.PositiveBigIntegerField(null=True, blank=True)
    expected_sha256 = models.CharField(max_length=64, blank=True)
    sha256 = models.CharField(max_length=64, blank=True, db_index=True)
    state = models.CharField(max_length=16, choices=[(s, s) for s in STATES], default=QUEUED)
    detail = models.TextField(blank=True)
    bytes_done = models.PositiveBigIntegerField(default=0)
    attempts = models.PositiveIntegerField(default=0)
    next_try_at = models.DateTimeField(null=True, blank=True)
    claimed_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["weights_id", "path"]
        constraints = [
            models.UniqueConstraint(fields=["weights", "path"], name="mirror_file_path_once")
        ]

    def __str__(self) -> str:
        return f"{self.weights.source}: {self.path}"


class EngineBuild(models.Model):
    """An engine's binary for one platform, held by the mirror by its digest, as weights are.

    Its bytes are the blob ``store.blob(sha256)``, which the mirror's file server gives
    agents; an agent whose node lacks the engine installs it from there.
    """

    engine = models.CharField(max_length=32)
    version = models.CharField(max_length=100)
    platform = models.CharField(max_length=40)
    sha256 = models.CharField(max_length=64, db_index=True)
    size = models.PositiveBigIntegerField()
    added_by = models.CharField(max_length=64)
    added_at = models.DateTimeField()

    class Meta:
        ordering = ["engine", "platform", "-added_at", "-pk"]
        # A build, or an llmgw release, runs as the agent's user on every node that takes
        # it: adding one is pushing code to the fleet, its own permission, which the
        # operators group does not hold (llmgw/core/permissions.py). Nothing changes one.
        default_permissions = ("view", "delete")
        permissions = [("push_enginebuild", "Can push engine builds and llmgw releases to nodes")]
        constraints = [
            models.UniqueConstraint(
                fields=["engine", "version", "platform"], name="mirror_engine_build_once"
            )
        ]

    def __str__(self) -> str:
        return f"{self.engine} {self.version} ({self.platform})"
