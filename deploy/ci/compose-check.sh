#!/usr/bin/env bash
# Builds the project's image with deploy/Dockerfile and runs the real compose stack
# (deploy/docker-compose.yml) end to end, then tears it all down, also on failure:
#   stand-ins   base images that cannot be pulled and are not cached (deploy/ci/standins/)
#   build       the project image, lumastra-tasks:local
#   stores      postgres, valkey-coord, valkey-cache up and healthy
#   migrate     the one-shot migrate, exit 0
#   roles       two web replicas, worker, beat, flower up and healthy
#   api         an API token; a run started through each web replica completes; static
#               files, Flower behind its credentials, /metrics behind its token, a schedule
#               fired by beat
#   sigterm     the worker stopped (SIGTERM) mid-run and started again: the run completes
#   backup      pg_dump; the database lost; pg_restore, migrate, the coordination Valkey
#               emptied: every run is back and new ones complete (docs/operations.md)
#   teardown    containers, volumes, network and the project image (not the cached stand-ins)
# and prints how long each phase took.
#
#   deploy/ci/compose-check.sh
#
# Engine: `docker compose` when a Docker engine answers; else podman with podman-compose
# (pinned below, installed from PyPI into a virtualenv in the cache directory). With podman
# the script runs what podman-compose + podman 4.3 do not (deploy/ci/compose.podman.yml says
# which): the health checks (no systemd runs them here), the start order on healthy stores.
# The run's own settings: deploy/ci/compose.ci.yml (a deploy/.env of yours is not read). Its secrets (LUMASTRA_SECRET_KEY,
# FLOWER_BASIC_AUTH, LUMASTRA_METRICS_TOKEN) are generated for this run and passed through the
# environment only; the image never sees them.
#
# Environment: LUMASTRA_CI_ENGINE (docker|podman: skip the detection), LUMASTRA_CI_CACHE
# (~/.cache/lumastra-ci: the podman-compose virtualenv, podman's containers.conf),
# LUMASTRA_CI_PROJECT (compose project name, lumastra-ci: a stack of your own named
# "lumastra" is left alone), LUMASTRA_CI_KEEP=1 (leave the stack up at the end, for a look;
# tear it down with the `down` command it prints), LUMASTRA_CI_TIMEOUT_S (180: the longest
# wait for any one condition).
set -euo pipefail

PODMAN_COMPOSE_VERSION=1.6.0

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
cache="${LUMASTRA_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lumastra-ci}"
project="${LUMASTRA_CI_PROJECT:-lumastra-ci}"
timeout_s="${LUMASTRA_CI_TIMEOUT_S:-180}"
image=lumastra-tasks:local
mkdir -p "$cache"

# --- output and timings ------------------------------------------------------------------

phases=()
phase_name=""
phase_began=""
script_began="$EPOCHREALTIME"

say() { printf '%s compose-check: %s\n' "$(date +%T)" "$*" >&2; }
die() {
  say "FAILED: $*"
  exit 1
}
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
end_phase() {
  if [[ -n "$phase_name" ]]; then
    local took
    took="$(elapsed "$phase_began" "$EPOCHREALTIME")"
    phases+=("$(printf '%-10s %7s s' "$phase_name" "$took")")
    say "phase $phase_name: $took s"
  fi
  phase_name=""
}
phase() {
  end_phase
  phase_name="$1"
  phase_began="$EPOCHREALTIME"
  say "--- $1"
}
print_timings() {
  printf '\ncompose-check timings (%s):\n' "$1" >&2
  local line
  for line in "${phases[@]}"; do
    printf '  %s\n' "$line" >&2
  done
  printf '  %-10s %7s s\n' total "$(elapsed "$script_began" "$EPOCHREALTIME")" >&2
}

# until_true <seconds> <what> <command...>: runs the command every second until it succeeds.
until_true() {
  local limit="$1" what="$2"
  shift 2
  local deadline=$((SECONDS + limit))
  until "$@"; do
    ((SECONDS < deadline)) || die "$what: not within $limit s"
    sleep 1
  done
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# --- the engine --------------------------------------------------------------------------

engine="${LUMASTRA_CI_ENGINE:-}"
if [[ -z "$engine" ]]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1 \
    && docker compose version >/dev/null 2>&1; then
    engine=docker
  else
    engine=podman
  fi
fi

podman_setup() {
  if [[ $(id -u) -eq 0 ]]; then
    "$repo/deploy/ci/install-podman.sh"
  fi
  command -v podman >/dev/null || die "no podman (deploy/ci/install-podman.sh installs it)"
  # podman's defaults that fail on machines like this one: rlimits above the machine's hard
  # limits (runc: "error setting rlimits ... operation not permitted"), crun on hybrid cgroups,
  # the systemd cgroup manager without systemd. CONTAINERS_CONF replaces the system's
  # containers.conf for this script's podman calls only; set it yourself to use your own.
  if [[ -z "${CONTAINERS_CONF:-}" ]]; then
    local nofile nproc
    nofile="$(ulimit -Hn)"
    nproc="$(ulimit -Hu)"
    [[ "$nofile" == unlimited || "$nofile" -gt 65536 ]] && nofile=65536
    # (nproc: 65536 failed here under a hard limit of 96362, 32768 did not; 4096 is plenty.)
    [[ "$nproc" == unlimited || "$nproc" -gt 4096 ]] && nproc=4096
    {
      echo "[containers]"
      echo "default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\"]"
      echo "[engine]"
      if command -v runc >/dev/null; then
        echo 'runtime = "runc"'
      fi
      if [[ ! -d /run/systemd/system ]]; then
        echo 'cgroup_manager = "cgroupfs"'
        echo 'events_logger = "file"'
      fi
    } >"$cache/containers.conf"
    export CONTAINERS_CONF="$cache/containers.conf"
  fi
  local venv="$cache/podman-compose-$PODMAN_COMPOSE_VERSION"
  if [[ ! -x "$venv/bin/podman-compose" ]]; then
    say "installing podman-compose $PODMAN_COMPOSE_VERSION into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "podman-compose==$PODMAN_COMPOSE_VERSION"
  fi
  compose=("$venv/bin/podman-compose" -p "$project" --env-file /dev/null
    -f deploy/docker-compose.yml -f deploy/ci/compose.ci.yml -f deploy/ci/compose.podman.yml)
  # Flower's host port: 5555 as in the compose file, another when 5555 is taken (podman-compose
  # does not interpolate variables in an `!override` value, so the file is written here).
  flower_port=5555
  port_free "$flower_port" || flower_port="$(free_port)"
  printf 'services:\n  flower:\n    ports: !override\n      - "%s:5555"\n' "$flower_port" \
    >"$cache/compose.flower-port.yml"
  compose+=(-f "$cache/compose.flower-port.yml")
}

phase setup
case "$engine" in
  docker)
    compose=(docker compose -p "$project" --env-file /dev/null
      -f deploy/docker-compose.yml -f deploy/ci/compose.ci.yml)
    ;;
  podman) podman_setup ;;
  *) die "LUMASTRA_CI_ENGINE must be docker or podman, not $engine" ;;
esac
say "engine: $engine ($("$engine" --version)); project $project"

# --- the run's secrets (environment only) ------------------------------------------------

token_of() { head -c "$1" /dev/urandom | base64 | tr -d '\n/+='; }
LUMASTRA_SECRET_KEY="$(token_of 48)"
FLOWER_BASIC_AUTH="ci:$(token_of 18)"
LUMASTRA_METRICS_TOKEN="$(token_of 24)"
POSTGRES_PASSWORD="$(token_of 18)"
export LUMASTRA_SECRET_KEY FLOWER_BASIC_AUTH LUMASTRA_METRICS_TOKEN POSTGRES_PASSWORD

if [[ "$engine" == docker ]]; then
  flower_port=5555
  for port in 8000 8001 5555; do
    port_free "$port" || die "port $port is taken; the compose file publishes it"
  done
fi

# --- containers of the project -------------------------------------------------------------

# containers_of <service>: the names of the service's containers (every replica).
containers_of() {
  "$engine" ps -a --filter "label=com.docker.compose.project=$project" \
    --filter "label=com.docker.compose.service=$1" --format '{{.Names}}' | sort
}
# The one-off containers `compose run` makes carry the service's label too: not a replica.
replicas_of() {
  containers_of "$1" | grep -v -E '_tmp|-run-' || true
}
state_of() { "$engine" inspect --format '{{.State.Status}}' "$1"; }

# healthy <container>: one health check now (podman: nothing else runs them without
# systemd); docker: the status its own checks set.
healthy() {
  if [[ "$engine" == podman ]]; then
    podman healthcheck run "$1" >/dev/null 2>&1
  else
    [[ "$(docker inspect --format '{{.State.Health.Status}}' "$1")" == healthy ]]
  fi
}

wait_healthy() {
  local service name names
  for service in "$@"; do
    names="$(replicas_of "$service")"
    [[ -n "$names" ]] || die "no container for service $service"
    for name in $names; do
      until_true "$timeout_s" "$name healthy" healthy "$name"
      say "$name: healthy"
    done
  done
}

# url_of <container>: how this machine reaches the web role in that container: its published
# port if it has one (Docker), else its address on the compose network (podman).
url_of() {
  local published address
  published="$("$engine" port "$1" 8000/tcp 2>/dev/null | head -1 || true)"
  if [[ -n "$published" ]]; then
    echo "http://127.0.0.1:${published##*:}"
    return
  fi
  address="$("$engine" inspect --format \
    '{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}' "$1" | awk '{print $1}')"
  [[ -n "$address" ]] || die "$1 has neither a published port nor an address"
  echo "http://$address:8000"
}

dump_state() {
  say "state of the stack:"
  "${compose[@]}" ps >&2 2>/dev/null || true
  local name
  for name in $("$engine" ps -a --filter "label=com.docker.compose.project=$project" \
    --format '{{.Names}}' 2>/dev/null); do
    printf '\n===== %s (%s) =====\n' "$name" "$(state_of "$name" 2>/dev/null)" >&2
    "$engine" logs --tail 40 "$name" >&2 2>&1 || true
  done
}

# remove_stack: every container, volume (named and anonymous), network and pod of the project.
remove_stack() {
  local ids volumes
  ids="$("$engine" ps -aq --filter "label=com.docker.compose.project=$project")"
  # Anonymous volumes (the stand-ins' VOLUME lines): podman-compose's `down -v` leaves them.
  volumes=""
  if [[ -n "$ids" ]]; then
    # shellcheck disable=SC2086
    volumes="$("$engine" inspect --format \
      '{{range .Mounts}}{{if eq .Type "volume"}}{{.Name}} {{end}}{{end}}' $ids 2>/dev/null || true)"
  fi
  "${compose[@]}" down -v --remove-orphans -t 10 >/dev/null 2>&1 || true
  # What compose leaves behind: `run` containers, and (podman-compose) the network.
  ids="$("$engine" ps -aq --filter "label=com.docker.compose.project=$project")"
  if [[ -n "$ids" ]]; then
    # shellcheck disable=SC2086
    "$engine" rm -f -v $ids >/dev/null 2>&1 || true
  fi
  if [[ "$engine" == podman ]]; then
    podman pod rm -f "pod_$project" >/dev/null 2>&1 || true
    podman network rm -f "${project}_default" >/dev/null 2>&1 || true
  fi
  local volume
  for volume in $volumes "${project}_postgres-data" "${project}_valkey-coord-data"; do
    "$engine" volume rm -f "$volume" >/dev/null 2>&1 || true
  done
}

built_image=0
teardown() {
  local code=$?
  trap - EXIT INT TERM
  end_phase
  if ((code != 0)); then
    dump_state
  fi
  if [[ "${LUMASTRA_CI_KEEP:-0}" == 1 ]]; then
    say "LUMASTRA_CI_KEEP=1: the stack stays up; remove it with:"
    say "  cd $repo && ${CONTAINERS_CONF:+CONTAINERS_CONF=$CONTAINERS_CONF }LUMASTRA_SECRET_KEY=- FLOWER_BASIC_AUTH=-:- ${compose[*]} down -v --remove-orphans && $engine rmi $image"
    print_timings "$([[ $code == 0 ]] && echo passed || echo FAILED)"
    exit "$code"
  fi
  phase teardown
  remove_stack
  if ((built_image)); then
    "$engine" rmi -f "$image" >/dev/null 2>&1 || true
  fi
  end_phase
  print_timings "$([[ $code == 0 ]] && echo passed || echo FAILED)"
  exit "$code"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A stack left by an earlier run that was killed before its teardown.
if [[ -n "$("$engine" ps -aq --filter "label=com.docker.compose.project=$project")" ]]; then
  say "removing the stack an earlier run left"
  remove_stack
fi

# --- (a) the base images -------------------------------------------------------------------

phase stand-ins
"$repo/deploy/ci/standins/build.sh" "$engine"

# --- (b) the project image -----------------------------------------------------------------

phase build
build_args=(-f deploy/Dockerfile -t "$image")
if [[ "$engine" == podman ]]; then
  # Docker format: OCI images have no HEALTHCHECK. BuildKit reads Dockerfile.dockerignore
  # beside the Dockerfile by itself; podman 4.3 needs it named.
  # No intermediate images: the project image is removed at the end, and its layers with it.
  build_args+=(--format docker --layers=false --ignorefile deploy/Dockerfile.dockerignore)
  # pip in the build reaches PyPI through this machine's CA bundle (a proxy's CA may be in it);
  # mounted for the build, never copied into the image.
  bundle=/etc/ssl/certs/ca-certificates.crt
  if [[ -f "$bundle" ]]; then
    build_args+=(-v "$bundle:$bundle:ro")
  fi
fi
built_image=1
"$engine" build -q "${build_args[@]}" . >/dev/null

# --- (c, d) the stack ----------------------------------------------------------------------

# compose_up [--no-deps] <service...>: quiet unless it fails.
compose_up() {
  local output
  if ! output="$("${compose[@]}" up -d --no-build "$@" 2>&1)"; then
    echo "$output" >&2
    die "compose up $*"
  fi
}

phase stores
compose_up postgres valkey-coord valkey-cache
wait_healthy postgres valkey-coord valkey-cache

phase migrate
compose_up --no-deps migrate
migrate="$(replicas_of migrate)"
[[ -n "$migrate" ]] || die "no migrate container"
until_true "$timeout_s" "migrate exits" bash -c "[[ \$($engine inspect --format '{{.State.Status}}' $migrate) == exited ]]"
migrate_code="$("$engine" inspect --format '{{.State.ExitCode}}' "$migrate")"
[[ "$migrate_code" == 0 ]] || {
  "$engine" logs "$migrate" >&2
  die "migrate exited with $migrate_code"
}
say "migrate: exit 0"

phase roles
compose_up --no-deps web worker beat flower
web_replicas="$(replicas_of web)"
[[ $(wc -w <<<"$web_replicas") -eq 2 ]] || die "expected 2 web replicas, found: $web_replicas"
wait_healthy web worker beat flower
# Every role runs as the image's own user, and cannot write the code it runs.
for name in $(replicas_of worker) $web_replicas; do
  # shellcheck disable=SC2016  # expanded in the container
  "$engine" exec "$name" sh -c '[ "$(id -u)" = 10001 ] && ! touch /app/manage.py 2>/dev/null' \
    || die "$name: runs as root, or can write /app"
done
say "roles run as uid 10001 and cannot write /app"
# Nothing of the stack may have stopped on the way (a role that exits at once looks
# "unhealthy" only while it is restarting).
for service in postgres valkey-coord valkey-cache web worker beat flower; do
  for name in $(replicas_of "$service"); do
    [[ "$(state_of "$name")" == running ]] || die "$name is $(state_of "$name")"
  done
done

# --- (e) through the API -------------------------------------------------------------------

phase api
# curl to a web replica: Host is one of LUMASTRA_ALLOWED_HOSTS whichever address is used.
web_curl() { curl -sS --max-time 15 -H "Host: localhost" "$@"; }
status_of() { curl -sS --max-time 15 -o /dev/null -w '%{http_code}' "$@"; }
expect_status() {
  local want="$1" what="$2" got
  shift 2
  got="$(status_of "$@")"
  [[ "$got" == "$want" ]] || die "$what: HTTP $got, expected $want"
  say "$what: HTTP $got"
}

admin_password="$(token_of 18)"
api_token="$("${compose[@]}" run --rm --no-deps -T -e DJANGO_SUPERUSER_PASSWORD="$admin_password" \
  web sh -c 'python manage.py createsuperuser --noinput --username ci --email ci@example.invalid >/dev/null && exec python manage.py create_api_token ci --name compose-check' \
  2>/dev/null | tail -1 | tr -d '\r')"
[[ -n "$api_token" ]] || die "no API token from create_api_token"
say "API token created (user ci)"

api() {
  local base="$1" method="$2" path="$3"
  shift 3
  web_curl -X "$method" -H "Authorization: Bearer $api_token" \
    -H 'Content-Type: application/json' "$@" "$base/api/v1$path"
}
start_run() { # start_run <base url> <input JSON> → run id
  local answer
  answer="$(api "$1" POST /runs -d "{\"task\": \"slow-progress\", \"input\": $2}")"
  jq -er .run_id <<<"$answer" || die "POST /runs on $1: $answer"
}
run_field() { api "$1" GET "/runs/$2" | jq -r "$3"; }
wait_state() { # wait_state <base> <run id> <state> <seconds>
  local deadline=$((SECONDS + $4)) state
  while :; do
    state="$(run_field "$1" "$2" .state)"
    [[ "$state" == "$3" ]] && return 0
    case "$state" in failed | cancelled) die "run $2 ended $state: $(api "$1" GET "/runs/$2")" ;; esac
    ((SECONDS < deadline)) || die "run $2: $state, not $3 within $4 s"
    sleep 0.5
  done
}

declare -a urls=()
for name in $web_replicas; do
  urls+=("$(url_of "$name")")
done
run_ids=()
for base in "${urls[@]}"; do
  expect_status 200 "$base /readyz" -H "Host: localhost" "$base/readyz"
  # The admin's own stylesheet: collected at build, served by the web role (WhiteNoise).
  expect_status 200 "$base static file" -H "Host: localhost" "$base/static/admin/css/base.css"
  expect_status 200 "$base admin sign-in page" -H "Host: localhost" "$base/admin/login/"
  run_ids+=("$(start_run "$base" '{"steps": 3, "step_seconds": 0.2}')")
  say "$base: started run ${run_ids[-1]}"
done
for i in "${!urls[@]}"; do
  # Read back through the other replica: both see the same stores.
  other="${urls[$(((i + 1) % ${#urls[@]}))]}"
  wait_state "$other" "${run_ids[$i]}" completed 60
  say "run ${run_ids[$i]}: completed (read through $other)"
done

flower="http://127.0.0.1:$flower_port"
expect_status 401 "Flower without credentials" "$flower/"
expect_status 200 "Flower with credentials" -u "$FLOWER_BASIC_AUTH" "$flower/"

expect_status 401 "/metrics without its token" -H "Host: localhost" "${urls[0]}/metrics"
metrics="$(web_curl -f -H "Authorization: Bearer $LUMASTRA_METRICS_TOKEN" "${urls[0]}/metrics")" \
  || die "/metrics with its token"
grep -q '^lumastra_' <<<"$metrics" || die "/metrics has no lumastra_ series"
say "/metrics with its token: HTTP 200, $(grep -c '^lumastra_' <<<"$metrics") lumastra_ samples"

# history-retention every 20 s (deploy/ci/compose.ci.yml): beat fires it.
scheduled() {
  [[ "$(api "${urls[0]}" GET "/runs?trigger_kind=schedule&limit=5" | jq '.items | length')" -gt 0 ]]
}
until_true 90 "a run started by a schedule" scheduled
beat="$(replicas_of beat | head -1)"
"$engine" logs "$beat" 2>&1 | grep -q 'Sending due task history-retention' \
  || die "beat's log shows no history-retention sent"
say "schedule fired: $(api "${urls[0]}" GET "/runs?trigger_kind=schedule&limit=1" \
  | jq -c '.items[0] | {task, state, trigger}')"

# --- (f) SIGTERM to the worker mid-run -------------------------------------------------------

phase sigterm
slow="$(start_run "${urls[0]}" '{"steps": 12, "step_seconds": 1}')"
say "slow run $slow started"
progressed() { [[ "$(run_field "${urls[0]}" "$slow" '.progress.done // 0 | floor')" -ge 2 ]]; }
until_true 60 "run $slow progresses" progressed
worker="$(replicas_of worker | head -1)"
stop_began=$SECONDS
# SIGTERM, then the compose file's stop_grace_period before a kill.
"${compose[@]}" stop worker >/dev/null 2>&1
say "$worker stopped after $((SECONDS - stop_began)) s, exit code" \
  "$("$engine" inspect --format '{{.State.ExitCode}}' "$worker")," \
  "run $slow: $(run_field "${urls[0]}" "$slow" .state)"
"$engine" logs --tail 15 "$worker" 2>&1 | sed 's/^/    worker: /' >&2
"${compose[@]}" start worker >/dev/null 2>&1
wait_state "${urls[0]}" "$slow" completed 120
say "run $slow: completed after the restart ($(run_field "${urls[0]}" "$slow" \
  '"attempts \(.attempts), result \(.result | tojson)"'))"
wait_healthy worker
# An idle worker stops at once on SIGTERM: nothing to wait for, nothing to hand back.
stop_began=$SECONDS
"${compose[@]}" stop worker >/dev/null 2>&1
idle_code="$("$engine" inspect --format '{{.State.ExitCode}}' "$worker")"
say "idle $worker stopped after $((SECONDS - stop_began)) s, exit code $idle_code"
if [[ "$idle_code" != 0 ]] || ((SECONDS - stop_began > 6)); then
  say "WARNING: an idle worker should stop promptly with exit code 0; its last lines:"
  "$engine" logs --tail 8 "$worker" 2>&1 | sed 's/^/    worker: /' >&2
fi

# --- (h) back up, lose, restore ---------------------------------------------------------------
# docs/operations.md's commands, as a user runs them: Postgres dumped; the database lost;
# the dump restored into an empty database, migrate run, the coordination Valkey emptied;
# the roles started again. Every run the dump held is back, and new runs complete.

phase backup
pg="$(replicas_of postgres | head -1)"
coord="$(replicas_of valkey-coord | head -1)"
dump="$(mktemp "${TMPDIR:-/tmp}/lumastra-ci-dump.XXXXXX")"
"$engine" exec "$pg" pg_dump -U lumastra -Fc lumastra >"$dump" || die "pg_dump"
say "pg_dump: $(wc -c <"$dump") bytes"
"${compose[@]}" stop web worker beat flower >/dev/null 2>&1
"$engine" exec "$pg" dropdb -U lumastra --force lumastra || die "dropdb"
"$engine" exec "$pg" createdb -U lumastra lumastra || die "createdb"
say "database lost (dropped, created empty)"
"$engine" exec -i "$pg" pg_restore -U lumastra -d lumastra --no-owner <"$dump" || die "pg_restore"
rm -f "$dump"
"${compose[@]}" run --rm --no-deps -T web python manage.py migrate --noinput >/dev/null 2>&1 \
  || die "migrate after the restore"
"$engine" exec "$coord" valkey-cli FLUSHALL >/dev/null || die "FLUSHALL on the coordination Valkey"
say "restored: pg_restore, migrate, coordination Valkey emptied"
"${compose[@]}" start web worker beat flower >/dev/null 2>&1
wait_healthy web worker beat flower
# Started again, a container may have a new address on the compose network (podman).
urls=()
for name in $web_replicas; do
  urls+=("$(url_of "$name")")
done
for run_id in "${run_ids[@]}" "$slow"; do
  [[ "$(run_field "${urls[0]}" "$run_id" .state)" == completed ]] \
    || die "run $run_id is not in the restored database as completed"
done
say "the ${#run_ids[@]} API runs and the slow run are back, completed"
after="$(start_run "${urls[1]}" '{"steps": 2, "step_seconds": 0.2}')"
wait_state "${urls[0]}" "$after" completed 90
say "a run started after the restore completed: $after"

end_phase
say "all checks passed"
