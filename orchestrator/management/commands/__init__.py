"""The engine's `manage.py` commands, one module each.

- `bootstrap_demo`: the demo user and a few demo runs (safe to run again), then where to look
- `create_api_token`: prints a new API token for a user, once; only its digest is stored
- `healthcheck`: the web role's probes for roles without HTTP (`--ready`: the stores as well)
- `lumastra`: the operator CLI (`runs`, `show`, `watch`, `cancel`, `retry`, `pause`, ...), its
  sub-commands in `orchestrator.management.cli`
- `sync_schedules`: static schedules → django-celery-beat rows, idempotently
"""
