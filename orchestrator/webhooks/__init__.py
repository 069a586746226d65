"""Webhooks: run events out to the endpoints that want them, signed, at least once
(docs/webhooks.md).

- `delivery`: the webhook loop: fans run events out to the endpoints and POSTs them, retried
- `signing`: signs a delivery (`X-Lumastra-Signature`) and checks a signature as receivers do
"""
