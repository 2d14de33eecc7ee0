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

fail() {  # fail MESSAGE...: the error on the terminal, exit code 2
  echo "error: $*" >&2
  exit 2
}

positive_int() {  # positive_int NAME VALUE: refuse anything but a positive integer
  [[ $2 =~ ^[1-9][0-9]*$ ]] || fail "$1 must be a positive integer, got '$2'"
}

absolute() {  # absolute PATH: PATH resolved from the caller's working directory
  case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac
}

fclub_rows() {  # fclub_rows T: steps per metrics row (T/50, else T/10) for a T that is a multiple of 10
  (( $1 % 10 == 0 )) || fail "STEPS must be a multiple of 10 (the tables report the regret at T/10), got $1"
  if (( $1 % 50 == 0 )); then echo $(($1 / 50)); else echo $(($1 / 10)); fi
}
