"""Webhooks: run events out to the endpoints that want them, signed, at least once, and
inbound triggers' requests in, signed the same way (docs/webhooks.md).

- `delivery`: the webhook loop: fans run events out to the endpoints and POSTs them, retried
- `signing`: signs a delivery (`X-Lumastra-Signature`) and checks a signature as receivers do
- `inbound`: an inbound trigger's signed request: the same check, and each request accepted once
"""
