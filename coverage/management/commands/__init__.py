"""The catalog's `manage.py` commands, one module each.

- `load_demo_catalog`: loads a realistic demo catalog (`--files`: with small real media files)
- `coverage_seed`: gives every item its row in every covered stage now
- `coverage_recount`: counts the rows per stage and status again; that becomes the base counts
"""
