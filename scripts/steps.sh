# Sourced by .ci/run and scripts/test: named steps, timed, with a table of every step's time
# printed when the script ends (on failure too, naming the step that was running).
#
#   . scripts/steps.sh
#   step "cargo fmt --check"      # ends the step before, starts this one: "== NAME (at 12 s)"
#   ...
#   steps_done                    # optional: ends the last step (the EXIT trap prints the table)
#   steps_on_exit() { ...; }      # optional: run at exit, before the table (e.g. end a background job)
_step_name='' _step_start=0 _step_times=()
_step_end() {
  if [ -n "$_step_name" ]; then
    _step_times+=("$(printf '%6d s  %s' $((SECONDS - _step_start)) "$_step_name")")
    _step_name=''
  fi
}
step() {
  _step_end
  _step_name=$1 _step_start=$SECONDS
  printf '\n== %s (at %d s)\n' "$1" "$SECONDS"
}
steps_done() { _step_end; }
_steps_summary() {
  local rc=$? running=$_step_name
  # Killed (a time limit, a cancelled run): bash runs this trap with $? = 0, which is no pass.
  [ -n "$_steps_signal" ] && rc=$_steps_signal
  _step_end
  if declare -F steps_on_exit >/dev/null; then steps_on_exit; fi
  printf '\n== %s: time per step\n' "${STEPS_TITLE:-$0}"
  printf '%s\n' "${_step_times[@]}"
  local failed=0
  if [ "$rc" -ne 0 ]; then
    failed=1
    printf '%s: failed (exit %d%s) in the step "%s", after %d s in all\n' "${STEPS_TITLE:-$0}" "$rc" \
      "${_steps_signal:+, killed}" "${running:-(before the first step)}" "$SECONDS"
    # A CI log may be cut in the middle: what failed, and the disk left, are said here at the end.
    [ -z "$_steps_err" ] || printf '%s: the command that failed: %s\n' "${STEPS_TITLE:-$0}" "$_steps_err"
    printf '%s: disk free: %s\n' "${STEPS_TITLE:-$0}" "$(df -h --output=avail . 2>/dev/null | tail -n 1 | tr -d ' ')"
  else
    printf '%s: %d s in all (%d min), exit %d\n' "${STEPS_TITLE:-$0}" "$SECONDS" $((SECONDS / 60)) "$rc"
  fi
  # The plain closing line a reader (or a CI that reads runners' last lines) looks for: each
  # step is a check; the one running when the script failed is the failed one.
  local passed=$((${#_step_times[@]} - failed))
  [ "$passed" -ge 0 ] || passed=0
  printf 'steps: %d passed, %d failed\n' "$passed" "$failed"
}
_steps_signal='' _steps_err=''
# The last command that failed (set -e ends the script on it): its text, exit code and line.
trap '_steps_err="$BASH_COMMAND (exit $?, ${BASH_SOURCE[0]##*/} line $LINENO)"' ERR
trap _steps_summary EXIT
trap '_steps_signal=143; exit 143' TERM
trap '_steps_signal=130; exit 130' INT
