# Shared by the reproduction scripts (source it): a fresh output folder, and logged runs whose errors reach the
# terminal instead of staying in a log.

fresh_out() {  # fresh_out DIR: refuse a folder that already holds results (a run refuses a folder holding a run)
  if [ -d "$1" ] && [ -n "$(ls -A "$1")" ]; then
    echo "error: output: $1 already holds results; give another folder as the first argument" >&2
    exit 2
  fi
  mkdir -p "$1"
}

logged() {  # logged LOG CMD...: run CMD with its output in LOG; on failure show the end of LOG and stop
  local log=$1
  shift
  if ! "$@" > "$log" 2>&1; then
    echo "error: a run failed (full log: $log); its last lines:" >&2
    tail -n 5 "$log" >&2
    exit 2
  fi
}
