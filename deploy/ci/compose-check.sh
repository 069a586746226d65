#!/usr/bin/env bash
# Builds the project's image with deploy/Dockerfile and runs the real compose stack
# (deploy/docker-compose.yml) end to end, then tears it all down, also on failure:
#   stand-ins   base images that cannot be pulled and are not cached (deploy/ci/standins/)
#   build       the project image, lumastra-tasks:local
#   stores      postgres, valkey-coord, valkey-cache up and healthy
#   migrate     the one-shot migrate, exit 0
#   roles       two web replicas, worker, beat, flower up and healthy; no development tool
#               (pytest, mypy, ruff, playwright, ...) in the image
#   api         an API token; a run started through each web replica completes; static
#               files, Flower behind its credentials, /metrics behind its token, a schedule
#               fired by beat
#   media       ffmpeg and ffprobe in the worker (preflight finds them); test videos made there
#               with ffmpeg; a media-probe and a trickplay run through the API complete; a
#               trickplay run cancelled mid-encode leaves no ffmpeg process behind
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
  # podman and what goes with it (deploy/system-deps.sh says which and why): installed when
  # missing and this user may; else each missing package is named with its install command.
  "$repo/deploy/system-deps.sh" compose || die "podman and its helpers are missing (above)"
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
  for volume in $volumes "${project}_postgres-data" "${project}_valkey-coord-data" \
    "${project}_trickplay" "${project}_media"; do
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
# Its size, as docs/operations.md records it (decimal MB, base image included).
say "image $image: $(("$("$engine" image inspect --format '{{.Size}}' "$image")" / 1000000)) MB"

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
# The image holds the runtime lock only (requirements.lock): no test, lint or type-checking
# tool, neither importable nor installed.
worker="$(replicas_of worker | head -1)"
for module in pytest mypy ruff playwright schemathesis hypothesis factory; do
  if "$engine" exec "$worker" python -c "import $module" >/dev/null 2>&1; then
    die "the image holds $module, a development tool (requirements-dev.lock only)"
  fi
done
dev_packages="$("$engine" exec "$worker" python -m pip list --format=freeze 2>/dev/null \
  | grep -iE '^(pytest[a-z-]*|mypy|ruff|playwright|schemathesis|hypothesis|factory.boy|django-stubs|celery-types|types-[a-z0-9-]+)==' || true)"
[[ -z "$dev_packages" ]] || die "development packages in the image: $(tr '\n' ' ' <<<"$dev_packages")"
say "the image holds no development tool ($("$engine" exec "$worker" python -m pip list \
  --format=freeze 2>/dev/null | grep -c '==') Python packages)"
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
start_task() { # start_task <base url> <task> <input JSON> → run id
  local answer
  answer="$(api "$1" POST /runs -d "{\"task\": \"$2\", \"input\": $3}")"
  jq -er .run_id <<<"$answer" || die "POST /runs ($2) on $1: $answer"
}
start_run() { start_task "$1" slow-progress "$2"; } # start_run <base url> <input JSON>
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

# history-retention every 20 s (deploy/ci/compose.ci.yml): beat fires it. The worker's boot
# catch-up may start the first scheduled run before beat's first send (20 s after beat starts),
# so beat's own send is waited for, not read once.
scheduled() {
  [[ "$(api "${urls[0]}" GET "/runs?trigger_kind=schedule&limit=5" | jq '.items | length')" -gt 0 ]]
}
until_true 90 "a run started by a schedule" scheduled
beat="$(replicas_of beat | head -1)"
beat_sent() { "$engine" logs "$beat" 2>&1 | grep -q 'Sending due task history-retention'; }
until_true 60 "beat's log shows history-retention sent" beat_sent
say "schedule fired: $(api "${urls[0]}" GET "/runs?trigger_kind=schedule&limit=1" \
  | jq -c '.items[0] | {task, state, trigger}')"

# --- (f) media work in the worker: ffmpeg, a probe, a trickplay, a cancel mid-encode ---------

phase media
worker="$(replicas_of worker | head -1)"
# ctx.run_process's grace (tasks/context.py, grace_s): SIGTERM to the command's process group,
# SIGKILL this long after.
process_grace_s=5
# The worker finds ffmpeg and ffprobe: the role's own preflight passes, and the full one (every
# store, and the programs registered tasks run) names no missing program.
preflight="$("$engine" exec "$worker" python -m lumastra.preflight --role worker 2>&1)" \
  || die "preflight --role worker in $worker: $preflight"
preflight+="$("$engine" exec "$worker" python -m lumastra.preflight --check-only 2>&1)" \
  || die "preflight --check-only in $worker: $preflight"
if grep -q "is not installed" <<<"$preflight"; then
  die "preflight in $worker: $(grep -A1 'is not installed' <<<"$preflight")"
fi
missing="$("$engine" exec "$worker" python -c \
  'from lumastra.preflight import missing_commands; print(*missing_commands(), sep="\n")' 2>&1)" \
  || die "$worker: cannot ask preflight for missing programs: $missing"
[[ -z "$missing" ]] || die "$worker: $missing"
say "preflight in $worker finds ffmpeg and ffprobe" \
  "($("$engine" exec "$worker" ffmpeg -version | head -1 | cut -d' ' -f1-3))"

# Test videos made in the worker container, in the media root the CI mounts there
# (deploy/ci/compose.ci.yml), as the operator (root) puts media there: a short one for the probe
# and the trickplay to complete, and one of 20 minutes (a 10 s clip looped, copied without
# re-encoding) whose trickplay takes long enough to be cancelled mid-encode.
media_dir=/srv/media/compose-check
began=$SECONDS
"$engine" exec -u 0 "$worker" sh -c "set -e; mkdir -p $media_dir; cd $media_dir
  ffmpeg -nostdin -v error -y -f lavfi -i testsrc2=duration=6:size=320x240:rate=25 \
    -f lavfi -i sine=duration=6 -c:v libx264 -pix_fmt yuv420p -c:a aac short.mkv
  ffmpeg -nostdin -v error -y -f lavfi -i testsrc2=duration=10:size=1280x720:rate=30 \
    -f lavfi -i sine=duration=10 -c:v libx264 -preset veryfast -crf 45 -pix_fmt yuv420p \
    -c:a aac clip.mkv
  ffmpeg -nostdin -v error -y -stream_loop 119 -i clip.mkv -c copy long.mkv
  rm clip.mkv" || die "ffmpeg in $worker could not make the test videos"
say "test videos made with ffmpeg in $worker in $((SECONDS - began)) s:" \
  "$("$engine" exec "$worker" sh -c "cd $media_dir && ls -s --block-size=K *.mkv | tr '\n' ' '")"

# The catalog knows them: a movie item each, with its file (the tasks take an item id).
catalog_ids="$("$engine" exec "$worker" python manage.py shell -c "
import json, os
from coverage.models import MediaFile, MediaFileItem, MediaItem
ids = {}
for name in ('short', 'long'):
    path = '$media_dir/' + name + '.mkv'
    item = MediaItem.objects.create(kind='movie', library='compose-check', title=name)
    file = MediaFile.objects.create(path=path, size=os.path.getsize(path))
    MediaFileItem.objects.create(file=file, item=item)
    ids[name] = item.id
print(json.dumps(ids))
" 2>&1 | tail -1)"
short_item="$(jq -er .short <<<"$catalog_ids")" || die "catalog items: $catalog_ids"
long_item="$(jq -er .long <<<"$catalog_ids")" || die "catalog items: $catalog_ids"
say "catalog: movie items $short_item (short.mkv) and $long_item (long.mkv)"

# A probe through one replica, its trickplay through the other.
probe="$(start_task "${urls[0]}" media-probe "{\"stage\": \"probe\", \"item_id\": $short_item}")"
wait_state "${urls[1]}" "$probe" completed 90
probed="$(run_field "${urls[1]}" "$probe" .result)"
jq -e '(.duration_s > 5.5 and .duration_s < 6.5) and ([.streams[].type] | sort == ["audio", "video"])' \
  <<<"$probed" >/dev/null || die "media-probe run $probe: $probed"
say "media-probe run $probe: completed, $(jq -c '{duration_s, streams}' <<<"$probed")"
trickplay="$(start_task "${urls[1]}" trickplay "{\"stage\": \"trickplay\", \"item_id\": $short_item}")"
wait_state "${urls[0]}" "$trickplay" completed 90
made="$(run_field "${urls[0]}" "$trickplay" .result)"
# A tile every 2 s of the 6 s video (tasks/definitions/catalog_media.py, TRICKPLAY_EVERY_S).
jq -e '.tiles >= 3 and .tiles <= 4' <<<"$made" >/dev/null || die "trickplay run $trickplay: $made"
"$engine" exec "$worker" sh -c "cd /srv/trickplay/$short_item && [ \"\$(head -c 3 sprite.jpg | od -An -tx1 | tr -d ' ')\" = ffd8ff ] && head -1 index.vtt | grep -qx WEBVTT" \
  || die "trickplay run $trickplay: no JPEG sprite and WebVTT index in /srv/trickplay/$short_item"
say "trickplay run $trickplay: completed, $(jq -c . <<<"$made")"

# The long video probed, then its trickplay cancelled once ffmpeg runs: within the grace and
# 5 s, no ffmpeg process is left in the worker container (a zombie counts as left).
ffmpeg_pids() {
  "$engine" exec "$worker" sh -c 'grep -lx ffmpeg /proc/[0-9]*/comm 2>/dev/null | cut -d/ -f3' \
    | tr '\n' ' ' || true
}
long_probe="$(start_task "${urls[0]}" media-probe "{\"stage\": \"probe\", \"item_id\": $long_item}")"
wait_state "${urls[0]}" "$long_probe" completed 90
[[ -z "$(ffmpeg_pids)" ]] || die "ffmpeg runs in $worker before the long trickplay: $(ffmpeg_pids)"
long_trickplay="$(start_task "${urls[1]}" trickplay "{\"stage\": \"trickplay\", \"item_id\": $long_item}")"
encoding() {
  [[ "$(run_field "${urls[1]}" "$long_trickplay" .state)" == active && -n "$(ffmpeg_pids)" ]]
}
until_true 60 "trickplay run $long_trickplay active with ffmpeg running" encoding
# Mid-encode: ffmpeg has decoded for a while (its run's progress says nothing yet: ffmpeg reports
# the time of its output, and the sprite is its one output frame, written at the end).
sleep 2
encoding || die "trickplay run $long_trickplay ended before its cancel: $(api "${urls[1]}" GET "/runs/$long_trickplay")"
# shellcheck disable=SC2016  # expanded in the container
ffmpeg_cpu="$("$engine" exec "$worker" sh -c 'for pid in $(grep -lx ffmpeg /proc/[0-9]*/comm | cut -d/ -f3); do cut -d" " -f14,15 /proc/$pid/stat; done' \
  | awk '{ s += $1 + $2 } END { printf "%.1f", s / 100 }')"
say "trickplay run $long_trickplay: active, ffmpeg (pid $(ffmpeg_pids | xargs)) in $worker has" \
  "decoded for $ffmpeg_cpu CPU seconds"
cancel_began="$EPOCHREALTIME"
answer="$(api "${urls[0]}" POST "/runs/$long_trickplay/cancel")"
jq -e '.state == "cancelling" or .state == "cancelled"' <<<"$answer" >/dev/null \
  || die "POST /runs/$long_trickplay/cancel: $answer"
limit_s=$((process_grace_s + 5))
until [[ -z "$(ffmpeg_pids)" ]]; do
  if (($(elapsed "$cancel_began" "$EPOCHREALTIME" | cut -d. -f1) >= limit_s)); then
    "$engine" exec "$worker" sh -c 'for p in $(grep -lx ffmpeg /proc/[0-9]*/comm | cut -d/ -f3); do grep -E "^(State|PPid)" /proc/$p/status | tr "\n" " "; echo; done' >&2 || true
    die "ffmpeg still runs in $worker $limit_s s after the cancel of $long_trickplay"
  fi
  sleep 0.2
done
say "no ffmpeg left in $worker $(elapsed "$cancel_began" "$EPOCHREALTIME") s after the cancel (limit $limit_s s)"
wait_state "${urls[1]}" "$long_trickplay" cancelled 30
"$engine" exec "$worker" sh -c "! ls /srv/trickplay/$long_item/*.partial* 2>/dev/null" \
  || die "the cancelled trickplay left a partial sprite in /srv/trickplay/$long_item"
say "trickplay run $long_trickplay: cancelled, no partial sprite left"

# --- (g) SIGTERM to the worker mid-run -------------------------------------------------------

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
