"""API bearer tokens: only a digest of each is kept (`orchestrator/api/tokens.py`)."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class ApiToken(models.Model):
    """A bearer token for the HTTP API. Only its SHA-256 digest is stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    name = models.CharField(max_length=100, blank=True, default="")
    prefix = models.CharField(max_length=12)  # shown in the admin to tell tokens apart
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "api_token"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"
