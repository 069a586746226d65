"""For webhook receivers: `verify(body, header, secret, tolerance)` checks a delivery's
`X-Lumastra-Signature` (docs/webhooks.md shows a receiver)."""

from orchestrator.webhooks.signing import (
    HEADER,
    DuplicateDelivery,
    WebhookVerificationError,
    sign,
    verify,
)

__all__ = ["HEADER", "DuplicateDelivery", "WebhookVerificationError", "sign", "verify"]
