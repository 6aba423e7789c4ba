"""The scheduler's tables: team quotas as site admins set them, allocations (who holds what), the admission lock."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from webapp.accounts.models import Team
from webapp.scheduling.resources import SchedulingError
from webapp.scheduling.workload import UNLIMITED, TeamQuota


class Quota(models.Model):
    """How much of the shared cluster one team may hold at once, and how many of its runs may wait.

    Empty (null) means unlimited; a team without a row is unlimited in every way. The fair-share window is not here:
    usage is only comparable between teams measured over the same window, so it is one setting for the cluster.
    """

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="quota")
    max_gpus = models.PositiveIntegerField(null=True, blank=True, help_text="GPUs held at once (empty: unlimited)")
    max_cpus = models.FloatField(null=True, blank=True, validators=[MinValueValidator(0)],
                                 help_text="CPUs held at once (empty: unlimited)")
    max_queued = models.PositiveIntegerField(null=True, blank=True,
                                             help_text="runs waiting in the queue at once (empty: unlimited)")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"quota of {self.team}"

    def as_policy(self) -> TeamQuota:
        """The same limits as the policy's value object (which validates them)."""
        return TeamQuota(max_gpus=self.max_gpus, max_cpus=self.max_cpus, max_queued=self.max_queued)

    def clean(self) -> None:
        try:
            self.as_policy()
        except SchedulingError as exc:
            raise ValidationError({exc.field: f"{exc.reason} (allowed: {exc.allowed})"}) from exc


def quota_of(team: Team) -> TeamQuota:
    """The team's limits; unlimited when no quota was set."""
    row = Quota.objects.filter(team=team).first()
    return UNLIMITED if row is None else row.as_policy()


class Allocation(models.Model):
    """What one admitted run holds on the cluster, from admission until it stops: the scheduler's books.

    A run has at most one open allocation (no end); a preempted run gets a new one when it is admitted again.
    Closed allocations are the history that fair share and the cluster page's usage chart read.
    """

    class End(models.TextChoices):
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"
        PREEMPTED = "preempted"
        LOST = "lost"  # its worker stopped renewing the run's lease (killed, or cut off)

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="allocations")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="allocations")
    bundles = models.JSONField(help_text='[{"cpus", "gpus", "memory_bytes"}, ...] as admitted')
    placement = models.JSONField(help_text="the node of each bundle")
    cpus = models.FloatField()
    gpus = models.PositiveIntegerField()
    memory_bytes = models.BigIntegerField(default=0)
    priority = models.CharField(max_length=8)
    preemptible = models.BooleanField(default=False)
    backfilled = models.BooleanField(default=False)
    iterations_at_start = models.PositiveIntegerField(default=0, help_text="progress measured from here")
    started_at = models.DateTimeField(db_index=True)
    ended_at = models.DateTimeField(null=True, blank=True, db_index=True)
    end = models.CharField(max_length=12, choices=End.choices, blank=True)
    preempted_for = models.PositiveBigIntegerField(null=True, blank=True, help_text="the run it made room for")
    sent_at = models.DateTimeField(null=True, blank=True, help_text="when its task last went to the workers")

    class Meta:
        ordering = ["started_at", "id"]
        # The database itself refuses a second open allocation of a run: admitting a run twice cannot commit.
        constraints = [models.UniqueConstraint(fields=["run"], condition=Q(ended_at__isnull=True),
                                               name="one_open_allocation_per_run")]

    def __str__(self) -> str:
        return f"allocation {self.pk} of run {self.run_id}"


class AdmissionLock(models.Model):
    """One row; an admission pass holds its lock, so passes in any process decide one after the other."""

    passes = models.PositiveBigIntegerField(default=0)
    last_pass_at = models.DateTimeField(null=True, blank=True)
    nodes = models.JSONField(default=list, blank=True,
                             help_text="the cluster's nodes at the last read; used while the dashboard does not answer")
    nodes_read_at = models.DateTimeField(null=True, blank=True)
