"""Training runs and what they leave behind: ordered events, sample games, checkpoints."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from earl_core.events import ENVELOPE_VERSION
from webapp.accounts.models import Team

CONFIG_SCHEMA_VERSION = 1


class Run(models.Model):
    """One training run of the EARL core, owned by a team."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        STARTING = "starting"
        RUNNING = "running"
        CANCELLING = "cancelling"
        CANCELLED = "cancelled"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    FINISHED = (Status.CANCELLED, Status.SUCCEEDED, Status.FAILED)
    ACTIVE = (Status.QUEUED, Status.STARTING, Status.RUNNING, Status.CANCELLING)

    class Priority(models.TextChoices):
        LOW = "low"
        NORMAL = "normal"
        HIGH = "high"
        URGENT = "urgent"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="runs")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="runs")
    name = models.CharField(max_length=100)
    config = models.JSONField(help_text="the core RunConfig as a dict (validated by earl_core.config)")
    config_version = models.PositiveSmallIntegerField(default=CONFIG_SCHEMA_VERSION)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.QUEUED, db_index=True)
    priority = models.CharField(max_length=8, choices=Priority.choices, default=Priority.NORMAL)
    resources = models.JSONField(default=dict, help_text="requested cpus / gpus / memory")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)
    summary = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    last_seq = models.PositiveIntegerField(default=0, help_text="highest event seq stored")
    iterations_done = models.PositiveIntegerField(default=0)
    cloned_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="clones")
    # Scheduling (webapp.scheduling): what the submitter declared, and what the admission pass last decided.
    preemptible = models.BooleanField(default=False, help_text="may be checkpointed and requeued for a higher class")
    expected_duration_s = models.FloatField(null=True, blank=True, validators=[MinValueValidator(1)],
                                            help_text="the submitter's estimate; lets the run backfill (null: unknown)")
    preempt_requested = models.BooleanField(default=False, help_text="the scheduler asked it to checkpoint and requeue")
    preemptions = models.PositiveIntegerField(default=0, help_text="times it was checkpointed and requeued")
    queue = models.JSONField(default=dict, blank=True,
                             help_text="while queued: position, reason, message, estimated_start (last admission pass)")
    # The worker lease (webapp.runs.leases): the attempt that holds the run renews heartbeat_at; a run whose heartbeat
    # stops is recovered (requeued to resume from its checkpoint) or failed. Only the holder of `lease` may write it.
    lease = models.CharField(max_length=80, blank=True, help_text="the worker attempt that holds the run")
    heartbeat_at = models.DateTimeField(null=True, blank=True, help_text="the holder's last sign of life")
    recoveries = models.PositiveIntegerField(default=0, help_text="times it was requeued after its worker was lost")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["team", "status"])]

    def __str__(self) -> str:
        return f"run {self.pk} {self.name} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in self.FINISHED

    @property
    def run_dir(self):  # -> Path
        return settings.EARL_RUNS_DIR / f"run-{self.pk:06d}"


class RunEvent(models.Model):
    """One event of a run's stream, in the v1 envelope; (run, seq) is unique and gap-free."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField()
    type = models.CharField(max_length=32)
    data = models.JSONField()
    ts = models.DateTimeField()

    class Meta:
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="one_event_per_seq")]
        indexes = [models.Index(fields=["run", "type", "seq"])]

    def envelope(self) -> dict:
        """The event as it travels to browsers (the same envelope the core emits)."""
        return {"v": ENVELOPE_VERSION, "run": self.run_id, "seq": self.seq, "ts": self.ts.isoformat().replace("+00:00", "Z"),
                "type": self.type, "data": self.data}


class Game(models.Model):
    """A sample game the run reported move by move (the board replays it)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="games")
    iteration = models.PositiveIntegerField()
    index = models.PositiveIntegerField(help_text="the game's number within its iteration")
    opponent = models.CharField(max_length=32)
    agent_side = models.PositiveSmallIntegerField()
    result = models.CharField(max_length=8)
    reward = models.FloatField()
    moves = models.CharField(max_length=64, help_text="columns 1-7 in order, Pons' convention")
    transcript = models.JSONField(default=list, help_text="the game.move events' data, in order")

    class Meta:
        ordering = ["run", "iteration", "index"]
        constraints = [models.UniqueConstraint(fields=["run", "iteration", "index"], name="one_game_per_slot")]


class Checkpoint(models.Model):
    """A Hugging Face-format checkpoint folder a run wrote."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    iteration = models.PositiveIntegerField()
    path = models.CharField(max_length=500)
    size_bytes = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["run", "iteration"]
        constraints = [models.UniqueConstraint(fields=["run", "iteration"], name="one_checkpoint_per_iteration")]
