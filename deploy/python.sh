# Sourced by the role scripts (`source deploy/python.sh <role>`): the Python to run the project
# with, in $PYTHON, after checking the role's variables.
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
# A role never starts on a value it cannot use, without a variable it requires (the secret
# every role signs sessions and CSRF tokens with, Flower's credentials), or on a coordination
# Valkey that may evict keys or keeps nothing on disk: the preflight names each problem
# (docs/environment.md). `make run` exports the demo's own values.
if [[ -n "${1:-}" ]]; then
  "$PYTHON" -m lumastra.preflight --role "$1" || exit 1
fi
export PYTHON
