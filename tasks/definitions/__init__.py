"""The task definitions that ship with the project: `maintenance` always loads, the others
when LUMASTRA_TASK_MODULES names them (it names all three by default).

- `maintenance`: the engine's own tasks, always registered: `history-retention`, daily
- `demo`: the demo pack `make run` starts: hash-folder, slow-progress, epg-refresh, demo-pipeline
- `catalog`: the demo's covered stages on the catalog: checksum, artwork, season-summary
- `catalog_media`: covered stages running ffmpeg's tools on the catalog's files: probe, trickplay
"""
