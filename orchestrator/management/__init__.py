"""The engine's `manage.py` commands.

- `commands`: one module per command (Django finds them there)
- `cli`: the sub-commands of `manage.py lumastra`, the operator CLI
"""
