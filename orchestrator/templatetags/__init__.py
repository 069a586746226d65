"""Template tags of the console pages (`{% load console %}`).

- `console`: `pairs`, a mapping's items by key (safe for a key named `items`)
"""
