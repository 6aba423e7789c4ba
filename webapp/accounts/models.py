"""Teams, who belongs to them with which role, and API tokens."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone


class Team(models.Model):
    """A group of people sharing runs (and, later, a cluster quota)."""

    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=50, unique=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    """A user's role in a team: admins manage it, members launch runs, viewers only watch."""

    class Role(models.TextChoices):
        ADMIN = "admin"
        MEMBER = "member"
        VIEWER = "viewer"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "team"], name="one_membership_per_team")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"

    @property
    def can_launch(self) -> bool:
        return self.role in (self.Role.ADMIN, self.Role.MEMBER)


def _hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ApiTokenQuerySet(models.QuerySet):
    def active(self) -> ApiTokenQuerySet:
        return self.filter(revoked_at__isnull=True)


class ApiToken(models.Model):
    """A bearer token for the REST API, the websocket and the `earl` CLI; only its hash is stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, default="cli")
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=8, help_text="first characters of the key, to tell tokens apart")
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    def __str__(self) -> str:
        return f"{self.prefix}... ({self.user}, {self.name})"

    @classmethod
    def issue(cls, user: object, name: str = "cli") -> tuple[ApiToken, str]:
        """A new token and its key; the key is shown once and never stored."""
        key = secrets.token_hex(20)
        token = cls.objects.create(user=user, name=name, key_hash=_hash_key(key), prefix=key[:8])
        return token, key

    @classmethod
    def find(cls, key: str) -> ApiToken | None:
        """The active token with this key, if any."""
        return cls.objects.active().select_related("user").filter(key_hash=_hash_key(key)).first()

    def revoke(self) -> None:
        self.revoked_at = timezone.now()
        self.save(update_fields=["revoked_at"])
