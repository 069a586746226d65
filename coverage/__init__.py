"""The media catalog stand-in and per-item coverage (docs/coverage.md): one row per catalog
item and covered stage, and the runs that bring every row to done.

The engine never imports this app: it plugs in through settings (`LUMASTRA_LOOP_FACTORIES`,
`LUMASTRA_METRICS_COLLECTORS`, `LUMASTRA_DEAD_LETTER_SOURCES`), `lumastra.urls` and SQL.

The catalog:
- `models`: the tables: the catalog (items, files, links, external ids), EPG sources, coverage
- `catalog`: a realistic demo catalog, generated from a seed and bulk-loaded
- `samples`: short real media rendered by ffmpeg, for the demo catalog's files
- `library`: the catalog kept in step with the media roots' files (new, rewritten, gone)
- `watcher`: the file watcher, a child of the worker role: media roots' changes into the catalog

Keeping every stage's rows moving:
- `stages`: the registry's covered stages, their `coverage_stage` rows, their conditions checked
- `queries`: coverage's SQL, one file each under `sql/`, filled with each stage's condition
- `dispatcher`: the outbox dispatcher: catalog changes become rows that need their stages again
- `sweep`: the stage-sweep: keeps every covered stage's rows moving, once a minute
- `counts`: the backlog's counts per stage and status, kept by triggers, folded by the sweep
- `loops`: the sweep and the dispatcher as loops of the worker role, on the cluster leader
- `retention`: deletes the outbox's dead letters once past their retention (`history-retention`)

For operators:
- `backlog`: how far each stage has got, which items are where and why, rescan and heal
- `api`: `/coverage`: the backlog over HTTP, mounted on the v1 API
- `outbox_api`: `/coverage/outbox/dead-letters`: the outbox's dead letters over HTTP, redeliver
- `admin`: the admin of the catalog, the EPG sources, the coverage rows and the outbox
- `dead_letters`: the outbox's dead letters on the admin's Dead letters page, and redeliver
- `metrics`: the backlog in /metrics: rows per stage and status, each stage's oldest due row
- `management`: the catalog's `manage.py` commands (the demo catalog, seeding, recounting)

The app:
- `config`: the catalog's settings (the sweep's, the dispatcher's, the outbox's retention)
- `apps`: the Django app; `manage.py check --database default` plans each stage's condition
"""
