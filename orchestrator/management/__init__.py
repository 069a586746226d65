"""The engine's `manage.py` commands.

- `commands`: one module per command (Django finds them there)
"""
