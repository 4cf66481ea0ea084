"""Tenancy: organizations, teams, projects, API keys, limits, usage, capacity quotas, tokens."""

from django.db import models

from .bands import BANDS, DEFAULT as DEFAULT_BAND


class Organization(models.Model):
    """The top of the tenancy tree: contains teams."""

    name = models.CharField(max_length=100, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Team(models.Model):
    """A team within an organization: contains projects."""

    org = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="teams")
    name = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["org__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["org", "name"], name="team_name_unique_in_org")
        ]

    def __str__(self) -> str:
        return f"{self.org.name}/{self.name}"


BAND_CHOICES = [(b, b) for b in BANDS]  # tenancy/bands.py


class Project(models.Model):
    """A project within a team: API keys belong to a project."""

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="projects")
    name = models.CharField(max_length=100)
    # Its keys' priority under overload, unless a key has its own: set through
    # services.band_set (audited), not admin's forms.
    band = models.CharField(
        max_length=10, choices=BAND_CHOICES, default=DEFAULT_BAND, editable=False
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team__org__name", "team__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="project_name_unique_in_team")
        ]

    def __str__(self) -> str:
        return f"{self.team.org.name}/{self.team.name}/{self.name}"


class ApiKey(models.Model):
    """A key for the OpenAI-compatible gateway. Only a hash of the secret is stored."""

    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, db_index=True)
    secret_hash = models.CharField(max_length=64, unique=True)
    models_allowed = models.JSONField(default=list, blank=True)
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveIntegerField(null=True, blank=True)
    # The most completion tokens one request may ask for (`max_tokens`); null: no cap.
    max_tokens = models.PositiveIntegerField(null=True, blank=True)
    # Its priority under overload; blank: its project's.
    band = models.CharField(
        max_length=10, choices=BAND_CHOICES, blank=True, default="", editable=False
    )
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class ScopeLimit(models.Model):
    """Request and token limits per minute for a scope (org, team or project)."""

    scope = models.CharField(max_length=40, unique=True, help_text="org:ID, team:ID or project:ID")
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.CharField(max_length=150, blank=True)

    def __str__(self) -> str:
        return self.scope


class Usage(models.Model):
    """Requests, tokens and errors per key, project and model in one-minute buckets."""

    bucket = models.DateTimeField()
    api_key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="usage")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="usage")
    model = models.CharField(max_length=64)
    requests = models.PositiveBigIntegerField(default=0)
    errors = models.PositiveBigIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    latency_ms_total = models.PositiveBigIntegerField(default=0)
    # Of the prompt and completion tokens, those no engine counted: estimated for requests
    # cut before their engine's usage came (docs/gateway.md, Usage).
    estimated_tokens = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["bucket", "api_key", "model"], name="usage_one_row_per_bucket"
            )
        ]
        indexes = [models.Index(fields=["project", "bucket"])]

    def __str__(self) -> str:
        return f"{self.bucket:%Y-%m-%d %H:%M} {self.model}"


class Budget(models.Model):
    """What a key or scope may spend per UTC day and per UTC month, in tokens (prompt and
    completion) and in cost (by ModelPrice); a figure left null is not budgeted
    (tenancy/budgets.py holds the rules)."""

    scope = models.CharField(
        max_length=40, unique=True, help_text="key:ID, org:ID, team:ID or project:ID"
    )
    tokens_per_day = models.PositiveBigIntegerField(null=True, blank=True)
    tokens_per_month = models.PositiveBigIntegerField(null=True, blank=True)
    cost_per_day = models.DecimalField(max_digits=16, decimal_places=4, null=True, blank=True)
    cost_per_month = models.DecimalField(max_digits=16, decimal_places=4, null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.CharField(max_length=150, blank=True)

    class Meta:
        verbose_name = "spend budget"

    def __str__(self) -> str:
        return self.scope


class ModelPrice(models.Model):
    """What a model's tokens cost, per million prompt and per million completion tokens, in
    the operator's currency, for cost budgets. Kept here by the model's name as usage rows
    hold it, not in the catalog: a price is the tenants' bill, and outlives the model."""

    model = models.CharField(max_length=64, unique=True)
    prompt_per_million = models.DecimalField(max_digits=12, decimal_places=4)
    completion_per_million = models.DecimalField(max_digits=12, decimal_places=4)
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["model"]

    def __str__(self) -> str:
        return self.model


class DailySpend(models.Model):
    """The Usage rows' tokens summed per UTC day, key and model: added in the same statement's
    transaction as the rows (services.usage.usage_add), so a month's spend for a budget is a sum of
    at most 31 rows per key and model rather than of 44,640 minutes."""

    day = models.DateField()
    api_key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="spend")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="spend")
    model = models.CharField(max_length=64)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["day", "api_key", "model"], name="daily_spend_one_row_per_day"
            )
        ]
        indexes = [models.Index(fields=["project", "day"])]

    def __str__(self) -> str:
        return f"{self.day} {self.model}"


class RequestRecord(models.Model):
    """One gateway request as it was answered, found by the id its caller was told
    (x-request-id): the Usage rows count it per minute, this names it. Written in the
    usage's batches (llmgw/gateway/usage.py), kept LLMGW_REQUESTS_KEEP_HOURS. The key and
    project are ids, not foreign keys: a record outlives a key deleted meanwhile, and a
    batch never fails on one. An id is not unique: a caller may send the same one twice."""

    request_id = models.CharField(max_length=128, db_index=True)
    at = models.DateTimeField(db_index=True, help_text="when it arrived")
    key_id = models.PositiveBigIntegerField()
    project_id = models.PositiveBigIntegerField()
    model = models.CharField(max_length=64, blank=True)
    endpoint = models.CharField(max_length=100, help_text="the path asked, /v1/chat/completions")
    status = models.PositiveSmallIntegerField(help_text="the HTTP status answered; 0: none")
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    duration_ms = models.PositiveIntegerField(default=0)
    replica = models.CharField(max_length=100, blank=True)
    error = models.CharField(max_length=64, blank=True, help_text="why it failed; blank if not")

    def __str__(self) -> str:
        return f"{self.request_id} {self.status}"


class UsageJournal(models.Model):
    """How much of a gateway process's usage journal (llmgw/gateway/journal.py) the Usage
    rows hold: the number of the last batch added, written in that batch's own transaction;
    and whether the journal of a process that died was settled, set in the transaction
    that added the rest. So a journal is counted exactly once, whenever a process dies."""

    name = models.CharField(max_length=200, unique=True)
    batch = models.PositiveBigIntegerField(default=0)
    settled = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name} (batch {self.batch}{', settled' if self.settled else ''})"


class CapacityQuota(models.Model):
    """A scope's guarantee and limit of GPUs, CPU cores and memory GB.

    A resource left null is not governed; zero is a limit of nothing.
    """

    scope = models.CharField(max_length=40, unique=True, help_text="org:ID, team:ID or project:ID")
    guarantee_gpus = models.PositiveIntegerField(null=True, blank=True)
    guarantee_cpu_cores = models.PositiveIntegerField(null=True, blank=True)
    guarantee_memory_gb = models.PositiveIntegerField(null=True, blank=True)
    limit_gpus = models.PositiveIntegerField(null=True, blank=True)
    limit_cpu_cores = models.PositiveIntegerField(null=True, blank=True)
    limit_memory_gb = models.PositiveIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.CharField(max_length=150, blank=True)

    def __str__(self) -> str:
        return self.scope


class PolicyRevision(models.Model):
    """The capacity quota policy's change counter: bumped in the writer's transaction by
    every write of a quota, organization, team or project (services.policy_revision_bump,
    called by each service and by admin's renames and deletes), so the reconciler reads the
    policy again only when it changed (timestamps would depend on every host's clock)."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    value = models.PositiveBigIntegerField(default=0)

    def __str__(self) -> str:
        return f"quota policy revision {self.value}"


class Token(models.Model):
    """An operator's admin token (REST API) or an agent's cluster join token.

    Only the SHA-256 of the secret is kept; the secret is printed once.
    """

    ADMIN = "admin"
    AGENT = "agent"
    KINDS = [(ADMIN, "admin"), (AGENT, "agent")]

    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=10, choices=KINDS, default=ADMIN)
    prefix = models.CharField(max_length=16)
    secret_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


class AuditEvent(models.Model):
    """Who changed what and when: one row per change made through the API, CLI or pages."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.CharField(max_length=150)
    # The admin token that made the call, "name (prefix…)", beside whatever name it claimed
    # in X-Llmgw-Actor; empty for a change made on the pages, in a session or on the server.
    token = models.CharField(max_length=130, blank=True)
    action = models.CharField(max_length=60)
    target = models.CharField(max_length=200)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.target}"
