"""`/triggers/{name}`: an integration's inbound trigger starts the task the trigger names
(`tasks.define_trigger`; docs/webhooks.md, "Inbound triggers").

Two ways in, judged like the rest of the API's credentials: a request that carries
`X-Lumastra-Signature` is judged by it alone; any other by its bearer token or session, with
the operate permission.

- **Signed**: the HMAC of the body with the trigger's secret (`LUMASTRA_TRIGGER_SECRET_<NAME>`),
  the scheme of our own webhook deliveries; a forged, tampered, malformed or stale signature is
  a 401 and counts against the client address's sign-in budget (`throttle`), a replay a 409
  (`webhooks.inbound`). A trigger with no secret refuses every signature (401): it takes bearer
  tokens only.
- **Token**: any operator's, as for `POST /runs`; the run's trigger then names the operator.

The body is mapped to the task's input by the trigger's `input_from` and started through
`start_run` with trigger `{"kind": "webhook", "name": <name>}`; an `Idempotency-Key` header
(else the key the trigger's `idempotency_key_from` names) joins a live run started with the
same key instead of starting another. Every refusal writes
no run; a refused start also forgets the signature, so the same request may be sent again.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from django.conf import settings
from django.http import HttpRequest
from ninja import Body, Header, Router
from ninja.responses import Status
from ninja.security import APIKeyHeader

from orchestrator.api import throttle
from orchestrator.api.auth import OPERATE, unthrottled_address
from orchestrator.api.errors import ApiError, answers
from orchestrator.api.starting import IdempotencyKey, StartedRun, answered, start_refusals
from orchestrator.runs.start import start_run
from orchestrator.triggers import TriggerKind
from orchestrator.webhooks import inbound
from orchestrator.webhooks.signing import HEADER, Signed, WebhookVerificationError
from tasks import registry
from tasks.registry import UnknownTriggerError
from tasks.triggers import TriggerDefinition

router = Router(tags=["triggers"])
IDEMPOTENCY_HEADER = "Idempotency-Key"
# What `input_from` raises for a body it cannot reshape (a missing key, a wrong type).
_UNFIT_BODY = (LookupError, TypeError, ValueError, AttributeError)


class SignedRequest:
    """`request.auth` of a request its trigger's signature let in."""

    def __init__(self, trigger: str, signed: Signed) -> None:
        self.trigger = trigger
        self.signed = signed


def _trigger(name: str) -> TriggerDefinition:
    try:
        return registry.get().trigger(name)
    except UnknownTriggerError as exc:
        raise ApiError(404, str(exc)) from None


def _key(found: object) -> str | None:
    if found is not None and not isinstance(found, str):
        raise TypeError(f"idempotency_key_from gave {type(found).__name__}, not a str")
    return found


class TriggerSignature(APIKeyHeader):
    """The signature header of docs/webhooks.md, checked with the secret of the trigger the
    path names; absent, the next credentials (bearer token, session) are asked."""

    param_name = HEADER

    def authenticate(self, request: HttpRequest, key: str | None) -> SignedRequest | None:
        if key is None:
            return None
        name = _trigger(str(request.resolver_match.kwargs.get("name", ""))).name  # type: ignore[union-attr]
        address = unthrottled_address(request)
        secret = settings.CONFIG.trigger_secrets.get(name)
        if secret is None:
            throttle.record_failure(address)
            raise ApiError(
                401,
                f"trigger {name!r} has no secret, so it takes no signature: send a bearer token",
                code="bad_signature",
            )
        tolerance = timedelta(seconds=settings.CONFIG.trigger_tolerance_s)
        try:
            signed = inbound.accept(name, request.body, key, secret, tolerance)
        except inbound.Replayed as exc:
            raise ApiError(409, str(exc), code="replayed") from None
        except WebhookVerificationError as exc:
            throttle.record_failure(address)
            raise ApiError(401, f"{HEADER} refused: {exc}", code="bad_signature") from None
        return SignedRequest(name, signed)


SIGNED_OR_OPERATE = [TriggerSignature(), *OPERATE]


@router.post(
    "/triggers/{name}",
    auth=SIGNED_OR_OPERATE,
    response=answers({200: StartedRun, 202: StartedRun}, 404, 409, 422, 503),
)
def fire(
    request: HttpRequest,
    name: str,
    body: Annotated[dict[str, Any], Body(description="mapped to the task's input by the trigger")],
    idempotency_key: Annotated[IdempotencyKey | None, Header(alias=IDEMPOTENCY_HEADER)] = None,
) -> Status[StartedRun]:
    """Start the run an integration's trigger names: 202 with the new run; 200 with the live
    run that already has this `Idempotency-Key`, or with the recorded run backpressure
    dropped. Authenticated by the trigger's signature (`X-Lumastra-Signature`) or by an
    operator's bearer token."""
    definition = _trigger(name)
    auth = request.auth  # type: ignore[attr-defined]
    trigger: dict[str, Any] = {"kind": TriggerKind.WEBHOOK.value, "name": definition.name}
    if not isinstance(auth, SignedRequest):
        trigger["actor"] = auth.username
    try:
        try:
            data = definition.input_from(body)
            if idempotency_key is None and definition.idempotency_key_from is not None:
                idempotency_key = _key(definition.idempotency_key_from(body))
        except _UNFIT_BODY as exc:
            raise ApiError(422, f"the body does not fit trigger {name!r}: {exc!r}") from None
        with start_refusals(input_at=("body", "input")):
            handle = start_run(
                definition.task,
                data,
                trigger=trigger,
                priority=definition.priority,
                idempotency_key=idempotency_key,
            )
    except ApiError:
        # Refused, nothing written: the same request may be sent again. After anything else
        # the run may exist (an error after its commit), so the signature stays spent.
        if isinstance(auth, SignedRequest):
            inbound.release(auth.trigger, auth.signed)
        raise
    return answered(handle)
