"""Notifications an operator receives: dead letters, circuits opened, schedules switched off by
their failures, run windows that closed with work still held, the drain's poison list growing,
a file watcher down. Sent with Apprise to `LUMASTRA_NOTIFY_URLS` (ntfy, Discord, Slack,
Telegram, e-mail, Gotify, a JSON endpoint, …), never from the path that noticed the event.

- `events`: writes one event's row (`notification_outbox`) where the event happens; a dead
  letter's is written by a trigger on task_history (`models.runs`)
- `targets`: the configured Apprise URLs and the kinds each one wants
- `delivery`: the leader's `notifications` loop: sends due rows, retried with backoff, each kind
  at most LUMASTRA_NOTIFY_MAX_PER_HOUR messages an hour (the rest as one digest)
"""
