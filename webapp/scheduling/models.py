"""A team's quota as site admins set it; the policy reads it as a ``TeamQuota``."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models

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
