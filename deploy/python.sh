# Sourced by the role scripts: the Python to run the project with, in $PYTHON.
# $LUMASTRA_PYTHON if set; else the project's virtualenv (.venv, made by `make install`) when
# there is one; else python3 from PATH (a container image installs the packages there).
# Stops with a clear message when that Python cannot import the project's packages.
project="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -n "${LUMASTRA_PYTHON:-}" ]]; then
  PYTHON="$LUMASTRA_PYTHON"
elif [[ -x "$project/.venv/bin/python" ]]; then
  PYTHON="$project/.venv/bin/python"
else
  PYTHON="$(command -v python3 || command -v python || true)"
fi
if [[ -z "$PYTHON" ]]; then
  echo "lumastra: no Python found: run 'make install' (creates .venv) or install Python 3.11" >&2
  exit 1
fi
if ! missing="$("$PYTHON" -c 'import django, celery, uvicorn' 2>&1)"; then
  echo "lumastra: $PYTHON cannot import the project's packages (${missing##*$'\n'})." >&2
  echo "lumastra: run 'make install' (creates .venv), or 'pip install -r requirements.lock'" \
    "into that Python, or point LUMASTRA_PYTHON at one that has them." >&2
  exit 1
fi
# Every role signs sessions and CSRF tokens with the same secret: a role never starts on the
# development fallback of lumastra/settings.py. `make run` exports the demo's own.
if [[ -z "${LUMASTRA_SECRET_KEY:-}" ]]; then
  echo "lumastra: LUMASTRA_SECRET_KEY is not set: give every role the same long random value" \
    "(e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(50))'); see docs/environment.md." >&2
  exit 1
fi
export PYTHON
