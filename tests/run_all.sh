#!/usr/bin/env bash
# `make test`: every stage, with its wall time printed at the end.
# Stages: lint (ansible-lint + argument-spec drift), sanity (ansible-test),
# unit (pytest tests/unit), molecule (every role scenario), e2e (local cloud).
# DT_TEST_STAGES="unit e2e" runs a subset.
#
# With both molecule and e2e selected, the scenarios that drive the local cloud
# (cluster, lifecycle) run first, then the e2e runs in the background while the
# role scenarios (each in its own container and network namespace) run beside it:
# both spend most of their time waiting on SSH, containers and training steps, not
# on the 2 cores. DT_TEST_SERIAL=1 runs everything one after another.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export PATH="$ROOT/.venv/bin:$PATH"
export CONTAINERS_CONF="$ROOT/localcloud/containers.conf"
export ANSIBLE_CONFIG="$ROOT/ansible.cfg"
STAGES=${DT_TEST_STAGES:-"lint sanity unit molecule e2e"}
declare -A TIMES RESULTS
overall=0
E2E=(python -m pytest tests/e2e -q -p no:cacheprovider -x)

# record_stage NAME RC T0: a stage's wall time and result for the table at the end.
record_stage() {
  TIMES[$1]=$((SECONDS - $3))
  RESULTS[$1]=$([ "$2" -eq 0 ] && echo pass || echo "FAIL (rc=$2)")
  [ "$2" -eq 0 ] || overall=1
}

run_stage() {
  local name=$1; shift
  echo "=== stage $name: $*"
  local t0=$SECONDS
  "$@"
  record_stage "$name" $? $t0
}

# `scenarios cloud|roles`: those on the local cloud use molecule's delegated (`default`) driver,
# the others a podman container of their own.
scenarios() {
  local f kind
  for f in molecule/*/molecule.yml; do
    kind=roles; grep -q "^  name: default" "$f" && kind=cloud
    [ "$kind" = "$1" ] && printf '%s ' "$(basename "$(dirname "$f")")"
  done
}

# e2e in the background (its output kept in a file, printed when it ends) beside the role scenarios.
run_e2e_beside_roles() {
  local log="$ROOT/tests/output/e2e.log"
  mkdir -p "$(dirname "$log")"
  echo "=== stage e2e (background, output in tests/output/e2e.log): ${E2E[*]}"
  local t0=$SECONDS
  "${E2E[@]}" >"$log" 2>&1 &
  local pid=$!
  DT_MOLECULE_SCENARIOS="$(scenarios roles)" run_stage molecule-roles bash tests/molecule.sh
  wait $pid
  record_stage e2e $? $t0
  echo "=== stage e2e: its output"
  cat "$log"
}

# The torch engine's node wheels (python -m localcloud wheelhouse --engine torch: PyTorch's CPU build,
# 192 MB; nothing when present), fetched once before the stages that use them. The torch molecule
# scenario and tests/e2e/test_torch_engine.py ask for them too, but fetched then they would arrive in
# the controller wheelhouse while another e2e module runs, and its wheel names are part of a baked
# image's recipe: an image baked before they arrived would be stale for that module's next bootstrap.
if [[ " $STAGES " == *" molecule "* || " $STAGES " == *" e2e "* ]]; then
  python -m localcloud wheelhouse --engine torch || overall=1
fi

parallel=0
if [[ " $STAGES " == *" molecule "* && " $STAGES " == *" e2e "* && -z "${DT_TEST_SERIAL:-}" && -z "${DT_MOLECULE_SCENARIOS:-}" ]]; then
  parallel=1
fi

# lint and sanity (static checks, a few minutes of CPU) run in the background beside the unit tests,
# whose time goes mostly to waiting on training processes and playbooks; their output is printed
# once the unit stage ends.
checks_beside_unit=0
if [[ " $STAGES " == *" unit "* && -z "${DT_TEST_SERIAL:-}" ]] \
    && [[ " $STAGES " == *" lint "* || " $STAGES " == *" sanity "* ]]; then
  checks_beside_unit=1
fi
checks_pid=
start_checks() {
  local log="$ROOT/tests/output/checks.log" status="$ROOT/tests/output/checks.status"
  mkdir -p "$(dirname "$log")"
  rm -f "$status"
  echo "=== stages lint, sanity (background, output in tests/output/checks.log)"
  (
    for s in lint sanity; do
      [[ " $STAGES " == *" $s "* ]] || continue
      t0=$SECONDS
      echo "=== stage $s: bash tests/$s.sh"
      bash "tests/$s.sh"
      echo "$s $? $((SECONDS - t0))" >>"$status"
    done
  ) >"$log" 2>&1 &
  checks_pid=$!
}
collect_checks() {
  [ -n "$checks_pid" ] || return 0
  wait "$checks_pid"
  checks_pid=
  echo "=== stages lint, sanity: their output"
  cat "$ROOT/tests/output/checks.log"
  local name rc secs
  while read -r name rc secs; do
    TIMES[$name]=$secs
    RESULTS[$name]=$([ "$rc" -eq 0 ] && echo pass || echo "FAIL (rc=$rc)")
    [ "$rc" -eq 0 ] || overall=1
  done <"$ROOT/tests/output/checks.status"
}

for stage in $STAGES; do
  case $stage in
    lint|sanity)
      if [ $checks_beside_unit = 1 ]; then
        [ -n "$checks_pid" ] || [ -n "${checks_started:-}" ] || { start_checks; checks_started=1; }
      else
        run_stage "$stage" bash "tests/$stage.sh"
      fi ;;
    # --timeout: a hung test fails with its traceback; --durations: where the stage's time went.
    unit)
      run_stage unit python -m pytest tests/unit -q -p no:cacheprovider --timeout=900 --durations=25
      collect_checks ;;
    molecule)
      if [ $parallel = 1 ]; then
        DT_MOLECULE_SCENARIOS="$(scenarios cloud)" run_stage molecule-cloud bash tests/molecule.sh
        run_e2e_beside_roles
      else
        run_stage molecule bash tests/molecule.sh
      fi ;;
    e2e) [ $parallel = 1 ] || run_stage e2e "${E2E[@]}" ;;
    *) echo "unknown stage $stage"; overall=1 ;;
  esac
done

collect_checks     # (when unit was not reached)

# Nothing stays behind: the cluster molecule scenarios and the e2e share the local cloud.
if [ -z "${DT_KEEP_CLOUD:-}" ] || [ "${DT_KEEP_CLOUD}" = 0 ]; then
  python -m localcloud down >/dev/null 2>&1 || true
fi

echo
echo "=== make test: wall time per stage"
for stage in lint sanity unit molecule molecule-cloud molecule-roles e2e; do
  [ -n "${TIMES[$stage]:-}" ] || continue
  printf '  %-14s %6ss  %s\n' "$stage" "${TIMES[$stage]}" "${RESULTS[$stage]}"
done
[ $checks_beside_unit = 1 ] && echo "  (lint and sanity ran beside unit)"
[ $parallel = 1 ] && echo "  (e2e ran beside molecule-roles)"
echo "  total          ${SECONDS}s"
exit $overall
