"""The operator CLI, `manage.py lumastra <command>` (`commands/lumastra.py` parses and
dispatches): the API's operations called in-process as a named user, printed as a table or as
the API's JSON, with exit codes scripts test.

- `exits`: the exit codes (one table, in `--help` too) and `Failure`, which leaves with one
- `acting`: the acting user (`--as`, LUMASTRA_CLI_USER), the API's permission check, the
  admin log entry an action leaves
- `arguments`: the options every sub-command takes; run ids, times and KEY=VALUE pairs
- `output`: a plain aligned table, or one JSON document
- `runs`: `runs`, `show`, `cancel`, `retry`
- `pauses`: `pause`, `resume` a task or a class
- `schedules`: `schedules`
- `dead_letters`: `dead-letters [--requeue]`
- `limits`: `limits`
- `watch`: `watch`: a run's state, progress and log lines until it ends
"""
