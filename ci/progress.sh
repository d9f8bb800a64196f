# Sourced by the ci/build-*.sh scripts: says what a long first build is doing, about how long it takes, and that it
# is still going. Everything goes to stderr; stdout stays the folder the script prints.

# progress_start NAME ESTIMATE: the build of NAME begins; ESTIMATE says how long it takes in words.
progress_start() {
  progress_name=$1
  progress_began=$(date +%s)
  echo "$progress_name: first build on this machine, $2; later runs reuse it" >&2
}

# progress_run STEP COMMAND...: runs COMMAND (a step of the build, named STEP) and prints a line every 30 s while
# it runs, so a slow build never looks stuck.
progress_run() {
  local step=$1 pid rc
  shift
  echo "$progress_name: building $step ($(progress_elapsed) elapsed)" >&2
  "$@" &
  pid=$!
  while ! progress_wait "$pid" 30; do
    echo "$progress_name: still building $step ($(progress_elapsed) elapsed)" >&2
  done
  wait "$pid" && rc=0 || rc=$?
  return "$rc"
}

# progress_done: the build is over.
progress_done() {
  echo "$progress_name: built in $(progress_elapsed)" >&2
}

progress_elapsed() {
  local s=$(($(date +%s) - progress_began))
  printf '%dm%02ds' $((s / 60)) $((s % 60))
}

# progress_wait PID SECONDS: true once PID has exited, false after SECONDS while it still runs.
progress_wait() {
  local i
  for ((i = 0; i < $2; i++)); do
    kill -0 "$1" 2>/dev/null || return 0
    sleep 1
  done
  ! kill -0 "$1" 2>/dev/null
}
