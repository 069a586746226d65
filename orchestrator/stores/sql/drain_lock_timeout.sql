-- Bound the row-lock waits of one drain replay transaction (recovery.drain_replay): a write that
-- waits longer fails as a transient error and the entry is tried again by a later pass, so one
-- locked run does not hold up the drain behind it. `set_config` rather than `SET LOCAL`, which
-- takes no parameters; its third argument keeps the setting to this transaction.
-- Parameters: timeout (a duration Postgres reads, such as '50ms').
SELECT set_config('lock_timeout', %(timeout)s, true)
