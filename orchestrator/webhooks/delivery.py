"""The webhook loop: run events out to the endpoints that want them, signed, at least once.

A trigger on task_history writes each change of a run's state as a CloudEvents 1.0 envelope
to `run_event_outbox`, in the change's own transaction, while any endpoint is enabled
(`orchestrator.models`). Every LUMASTRA_WEBHOOK_INTERVAL_S, on the cluster leader:

1. **Fan out**: the oldest events (`FOR UPDATE SKIP LOCKED`, batches of BATCH, at most
   MAX_BATCHES a pass) become one
   `webhook_delivery` per enabled endpoint whose filter (states, tasks) matches, and leave
   the outbox, in one transaction.
2. **Send**: due deliveries of enabled endpoints are leased (for as long as the whole batch
   could take) and POSTed, SENDERS at a time, with
   `Content-Type: application/cloudevents+json` and `X-Lumastra-Signature`
   (`webhooks.signing`). A 2xx answer delivers; anything else, a timeout
   (LUMASTRA_WEBHOOK_TIMEOUT_S) or a refused connection is retried with exponential backoff
   and jitter, and after LUMASTRA_WEBHOOK_MAX_ATTEMPTS the delivery is dead: the admin lists
   it and redelivers it.
3. **Prune**: delivered rows older than HISTORY are deleted, at most hourly.

Redirects are not followed (a 3xx is a failed send), and an endpoint whose host resolves to a
loopback, private or link-local address is refused unless LUMASTRA_WEBHOOK_ALLOW_PRIVATE
(checked at each send; a host that changes its address between the check and the connection
is not caught). A run never waits for any of this. A worker that dies mid-send leaves its
leased deliveries to be sent again once the lease passes: receivers see at least once and
deduplicate by the event's `id`. Not guaranteed: the order of deliveries, even to one endpoint.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import secrets
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q, QuerySet

from orchestrator.backoff import jittered_backoff
from orchestrator.clock import SYSTEM, Clock
from orchestrator.cluster.locks import Fence
from orchestrator.models import (
    DeliveryStatus,
    RunEventOutbox,
    WebhookDelivery,
    WebhookEndpoint,
)
from orchestrator.states import RunState
from orchestrator.webhooks.signing import HEADER, sign
from tasks import registry
from tasks.policies import Retry

log = logging.getLogger(__name__)

BATCH = 500
# Batches one pass takes at most, of events and of deliveries each; the rest wait for the next.
MAX_BATCHES = 20
SENDERS = 8
HISTORY = timedelta(days=7)
PRUNE_EVERY_S = 3600
# The backoff between attempts (how many: LUMASTRA_WEBHOOK_MAX_ATTEMPTS).
BACKOFF = Retry(max_attempts=1, base=timedelta(seconds=10), cap=timedelta(hours=1))


class InvalidEndpoint(ValueError):
    pass


class UnknownTasks(InvalidEndpoint):
    pass


def check_endpoint(url: object, states: object, tasks: object) -> None:
    """Raises InvalidEndpoint unless `url` is an http(s) URL and `states` and `tasks` are
    lists of known run states and task ids (the API and the admin's form both ask)."""
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise InvalidEndpoint("url must be an http:// or https:// URL")
    if not isinstance(states, list) or not all(isinstance(s, str) for s in states):
        raise InvalidEndpoint("states must be a list of run states")
    if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
        raise InvalidEndpoint("tasks must be a list of task ids")
    known_states = {state.value for state in RunState}
    if unknown := sorted(set(states) - known_states):
        raise InvalidEndpoint(f"unknown states {unknown}; known: {sorted(known_states)}")
    if unknown := sorted(set(tasks) - set(registry.get())):
        raise UnknownTasks(f"unknown tasks {unknown}")


def create_endpoint(
    url: str, *, states: list[str], tasks: list[str], description: str = ""
) -> tuple[WebhookEndpoint, str]:
    """A new enabled endpoint and its signing secret (shown to the caller once)."""
    check_endpoint(url, states, tasks)
    secret = "whsec_" + secrets.token_urlsafe(32)
    endpoint = WebhookEndpoint.objects.create(
        url=url, secret=secret, states=states, tasks=tasks, description=description
    )
    return endpoint, secret


def dead() -> QuerySet[WebhookDelivery]:
    """The deliveries that failed every attempt, for an operator to `redeliver` (one partial
    index, webhook_delivery_dead, serves them)."""
    return WebhookDelivery.objects.filter(status=DeliveryStatus.DEAD)


def redeliver(delivery_ids: list[int]) -> int:
    """Dead (or pending) deliveries sent again now, attempts from zero; one being sent right
    now is left to its sender (sending it twice at once helps nobody)."""
    now = SYSTEM.now()
    return (
        WebhookDelivery.objects.filter(id__in=delivery_ids)
        .exclude(status=DeliveryStatus.DELIVERED)
        .exclude(leased_until__gt=now)
        .update(
            status=DeliveryStatus.PENDING,
            attempts=0,
            next_attempt_at=now,
            leased_until=None,
            last_error="",
        )
    )


@dataclass
class DeliveryReport:
    fanned_out: int = 0
    delivered: int = 0
    failed: int = 0
    dead: int = 0


@dataclass(frozen=True)
class _Sent:
    status_code: int | None
    error: str


class Deliverer:
    def __init__(self, clock: Clock = SYSTEM) -> None:
        self.clock = clock
        self._pruned_at = 0.0

    def tick(self, fence: Fence | None = None) -> DeliveryReport:
        """One pass; with `fence` (the cluster seat), none unless this process still leads."""
        if fence is not None:
            fence.check()
        report = DeliveryReport()
        for _ in range(MAX_BATCHES):
            if self.fan_out(report) < BATCH:
                break
        for _ in range(MAX_BATCHES):
            if fence is not None:
                fence.check()
            if self.send_due(report) < BATCH:
                break
        if time.monotonic() - self._pruned_at > PRUNE_EVERY_S:
            self._pruned_at = time.monotonic()
            self._prune()
        if report.fanned_out or report.delivered or report.failed:
            log.info(
                "webhooks: %d deliveries made, %d delivered, %d failed (%d dead)",
                report.fanned_out,
                report.delivered,
                report.failed,
                report.dead,
            )
        return report

    def fan_out(self, report: DeliveryReport) -> int:
        """One batch of events into deliveries; returns how many events it took."""
        with transaction.atomic():
            events = list(
                RunEventOutbox.objects.select_for_update(skip_locked=True).order_by("created_at")[
                    :BATCH
                ]
            )
            if not events:
                return 0
            endpoints = list(WebhookEndpoint.objects.filter(enabled=True))
            now = self.clock.now()
            made = []
            for event in events:
                envelope = event.envelope
                state = str(envelope["type"]).rsplit(".", 1)[-1]
                task_id = str(envelope.get("data", {}).get("task", ""))
                made += [
                    WebhookDelivery(
                        endpoint=endpoint,
                        event_id=event.id,
                        event_type=envelope["type"],
                        run_id=envelope["subject"],
                        envelope=envelope,
                        next_attempt_at=now,
                    )
                    for endpoint in endpoints
                    if endpoint.wants(state, task_id)
                ]
            WebhookDelivery.objects.bulk_create(made, ignore_conflicts=True)
            RunEventOutbox.objects.filter(id__in=[event.id for event in events]).delete()
        report.fanned_out += len(made)
        return len(events)

    def send_due(self, report: DeliveryReport) -> int:
        """Lease and send one batch of due deliveries; returns how many it took."""
        now = self.clock.now()
        lease = now + _lease()
        with transaction.atomic():
            due = list(
                WebhookDelivery.objects.select_for_update(skip_locked=True, of=("self",))
                .select_related("endpoint")
                .filter(
                    status=DeliveryStatus.PENDING,
                    next_attempt_at__lte=now,
                    endpoint__enabled=True,
                )
                .filter(Q(leased_until__isnull=True) | Q(leased_until__lt=now))
                .order_by("next_attempt_at")[:BATCH]
            )
            WebhookDelivery.objects.filter(id__in=[d.id for d in due]).update(leased_until=lease)
        if not due:
            return 0
        with ThreadPoolExecutor(max_workers=SENDERS, thread_name_prefix="webhook") as pool:
            outcomes = list(pool.map(_send, due))
        for delivery, sent in zip(due, outcomes, strict=True):
            delivery.leased_until = lease
            self._record(delivery, sent, report)
        return len(due)

    def _record(self, delivery: WebhookDelivery, sent: _Sent, report: DeliveryReport) -> None:
        now = self.clock.now()
        attempts = delivery.attempts + 1
        # Only under this pass's lease: a sender that outlived it (a failover) records nothing.
        ours = WebhookDelivery.objects.filter(id=delivery.id, leased_until=delivery.leased_until)
        if sent.status_code is not None and 200 <= sent.status_code < 300:
            ours.update(
                status=DeliveryStatus.DELIVERED,
                attempts=attempts,
                delivered_at=now,
                last_status_code=sent.status_code,
                last_error="",
                leased_until=None,
            )
            report.delivered += 1
            return
        dead = attempts >= settings.CONFIG.webhook_max_attempts
        ours.update(
            status=DeliveryStatus.DEAD if dead else DeliveryStatus.PENDING,
            attempts=attempts,
            next_attempt_at=now + jittered_backoff(BACKOFF, attempts),
            last_status_code=sent.status_code,
            last_error=sent.error[:2000],
            leased_until=None,
        )
        report.failed += 1
        report.dead += dead
        log.warning(
            "webhook delivery %s of %s to %s failed (attempt %d%s): %s",
            delivery.id,
            delivery.event_id,
            delivery.endpoint.url,
            attempts,
            ", dead" if dead else "",
            sent.error,
        )

    def _prune(self) -> None:
        old = WebhookDelivery.objects.filter(
            status=DeliveryStatus.DELIVERED, delivered_at__lt=self.clock.now() - HISTORY
        ).values_list("id", flat=True)[:10_000]
        WebhookDelivery.objects.filter(id__in=list(old)).delete()


def _lease() -> timedelta:
    """Long enough for a whole batch to time out, SENDERS at a time, with a margin."""
    rounds = -(-BATCH // SENDERS)
    return timedelta(seconds=settings.CONFIG.webhook_timeout_s * rounds + 60)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer like any other non-2xx: the event is not re-sent elsewhere."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def _refused_address(url: str) -> str | None:
    """Why `url` may not be sent to: its host resolves to a loopback, private, link-local or
    otherwise internal address (unless LUMASTRA_WEBHOOK_ALLOW_PRIVATE), or does not resolve."""
    if settings.CONFIG.webhook_allow_private:
        return None
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except OSError as exc:
        return f"cannot resolve {host!r}: {exc}"
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if not ip.is_global:
            return (
                f"{host!r} resolves to {ip}, an internal address "
                "(LUMASTRA_WEBHOOK_ALLOW_PRIVATE allows it)"
            )
    return None


def _send(delivery: WebhookDelivery) -> _Sent:
    refused = _refused_address(delivery.endpoint.url)
    if refused is not None:
        return _Sent(None, f"refused: {refused}")
    body = json.dumps(delivery.envelope, separators=(",", ":")).encode()
    request = urllib.request.Request(  # noqa: S310 (create_endpoint allows http(s) only)
        delivery.endpoint.url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/cloudevents+json",
            HEADER: sign(body, delivery.endpoint.secret),
            "User-Agent": "lumastra-webhooks/1",
        },
    )
    try:
        with _OPENER.open(request, timeout=settings.CONFIG.webhook_timeout_s) as response:
            return _Sent(int(response.status), "")
    except urllib.error.HTTPError as exc:
        return _Sent(exc.code, f"HTTP {exc.code}")
    except (OSError, ValueError) as exc:
        return _Sent(None, f"{type(exc).__name__}: {exc}")
