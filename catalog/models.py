"""The catalog: models, the profiles they may run with, and what was measured of them."""

from django.db import models


class Model(models.Model):
    """A model llmgw keeps running: how many replicas, of what class, for whom.

    Declared models come from the catalog file (LLMGW_CATALOG) and refuse changes
    through the API; runtime models are added through the API or pages.
    """

    name = models.CharField(max_length=64, unique=True)
    aliases = models.JSONField(default=list, blank=True)
    description = models.TextField(blank=True)
    source = models.CharField(max_length=500, blank=True)
    min_replicas = models.PositiveIntegerField(default=1)
    max_replicas = models.PositiveIntegerField(default=1)
    idle_timeout_s = models.PositiveIntegerField(default=600)
    # The autoscaler's thresholds (catalog.domain.ModelSpec); null: its defaults.
    target_waiting = models.FloatField(null=True, blank=True)
    kv_ceiling = models.FloatField(null=True, blank=True)
    capacity_class = models.CharField(max_length=16, blank=True)
    owner = models.CharField(
        max_length=40, blank=True, help_text="org:ID, team:ID, project:ID or empty (shared)"
    )
    fallbacks = models.JSONField(default=list, blank=True)
    routing_profile = models.CharField(max_length=16, default="chat")
    slo = models.JSONField(default=dict, blank=True)
    context_length = models.PositiveIntegerField(null=True, blank=True)
    max_output = models.PositiveIntegerField(null=True, blank=True)
    declared = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Profile(models.Model):
    """One way a model may run: engine, GPUs or CPU, resources, where and in what order."""

    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="profiles")
    position = models.PositiveIntegerField(default=0)
    name = models.CharField(max_length=64)
    engine = models.CharField(max_length=16)
    gpu_class = models.CharField(max_length=40, blank=True)
    tp = models.PositiveIntegerField(default=1)
    pp = models.PositiveIntegerField(default=1)
    nodes = models.PositiveIntegerField(default=1)
    gpus_per_node = models.PositiveIntegerField(null=True, blank=True)
    args = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)
    min_memory_gb = models.FloatField(null=True, blank=True)
    cpu_cores = models.PositiveIntegerField(null=True, blank=True)
    min_disk_gb = models.FloatField(null=True, blank=True)
    node_selector = models.JSONField(default=dict, blank=True)
    weight = models.PositiveIntegerField(default=1)
    priority = models.IntegerField(default=0)
    startup_timeout_s = models.PositiveIntegerField(default=600)
    # How the gateway chooses among its replicas; empty: the engine's default.
    routing = models.CharField(max_length=16, blank=True, default="")
    # What a replica draws, in watts, as declared; null: placement estimates it.
    power_watts = models.FloatField(null=True, blank=True)
    # LoRA adapters one replica holds at once; 0: it serves none.
    adapter_slots = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["model", "position"]
        constraints = [
            models.UniqueConstraint(fields=["model", "name"], name="profile_name_unique_in_model")
        ]

    def __str__(self) -> str:
        return f"{self.model.name}/{self.name}"


class Adapter(models.Model):
    """A LoRA adapter served on its base model's replicas (catalog.domain.AdapterSpec):
    a team's fine-tune, reached by its owner's keys under its own name."""

    name = models.CharField(max_length=64, unique=True)
    base = models.ForeignKey(Model, on_delete=models.PROTECT, related_name="adapters")
    aliases = models.JSONField(default=list, blank=True)
    description = models.TextField(blank=True)
    source = models.CharField(max_length=500)
    format = models.CharField(max_length=8)
    rank = models.PositiveIntegerField()
    owner = models.CharField(max_length=40, help_text="team:ID or project:ID")
    declared = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} (on {self.base.name})"


class Measurement(models.Model):
    """What `ctl bench --save` found for a model on a profile."""

    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="measurements")
    profile = models.CharField(max_length=64)
    max_concurrency = models.PositiveIntegerField()
    tok_per_sec = models.FloatField()
    ttft_p95_ms = models.FloatField(null=True, blank=True)
    tpot_p95_ms = models.FloatField(null=True, blank=True)
    # What one replica drew while it was measured, in watts; null: not measured.
    watts = models.FloatField(null=True, blank=True)
    # The share of their default power limit its GPUs were held to while it was measured;
    # null: at their default (a replica held lower counts less, docs/facility.md).
    power_share = models.FloatField(null=True, blank=True)
    measured_at = models.DateTimeField()
    measured_by = models.CharField(max_length=150, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["model", "profile"], name="one_measurement_per_profile")
        ]

    def __str__(self) -> str:
        return f"{self.model_id}/{self.profile}: {self.max_concurrency} at once, {self.tok_per_sec:g} tok/s"


class Revision(models.Model):
    """The catalog's change counter, bumped by every write in the same transaction, so each
    process knows when to read the catalog again (timestamps would depend on every host's clock)."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    value = models.PositiveBigIntegerField(default=0)
    # The measurements' own counter, bumped by every write of one, a model's removal included
    # (services.measurements_revision_bump): a measurement is not a catalog change, but the
    # reconciler reads the measurements again when it moves.
    measurements = models.PositiveBigIntegerField(default=0)

    def __str__(self) -> str:
        return f"catalog revision {self.value}"
