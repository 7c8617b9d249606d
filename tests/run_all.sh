#!/usr/bin/env bash
# `make test`: every stage, with its wall time printed at the end.
# Stages: lint (ansible-lint + argument-spec drift), sanity (ansible-test),
# unit (pytest tests/unit), molecule (every role scenario), e2e (local cloud).
# DT_TEST_STAGES="unit e2e" runs a subset.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export PATH="$ROOT/.venv/bin:$PATH"
export CONTAINERS_CONF="$ROOT/localcloud/containers.conf"
export ANSIBLE_CONFIG="$ROOT/ansible.cfg"
STAGES=${DT_TEST_STAGES:-"lint sanity unit molecule e2e"}
declare -A TIMES RESULTS
overall=0

run_stage() {
  local name=$1; shift
  echo "=== stage $name: $*"
  local t0=$SECONDS
  "$@"
  local rc=$?
  TIMES[$name]=$((SECONDS - t0))
  RESULTS[$name]=$([ $rc -eq 0 ] && echo pass || echo "FAIL (rc=$rc)")
  [ $rc -eq 0 ] || overall=1
}

for stage in $STAGES; do
  case $stage in
    lint) run_stage lint bash tests/lint.sh ;;
    sanity) run_stage sanity bash tests/sanity.sh ;;
    unit) run_stage unit python -m pytest tests/unit -q -p no:cacheprovider ;;
    molecule) run_stage molecule bash tests/molecule.sh ;;
    e2e) run_stage e2e python -m pytest tests/e2e -q -p no:cacheprovider -x ;;
    *) echo "unknown stage $stage"; overall=1 ;;
  esac
done

# Nothing stays behind: the cluster molecule scenario and the e2e share the local cloud.
if [ -z "${DT_KEEP_CLOUD:-}" ] || [ "${DT_KEEP_CLOUD}" = 0 ]; then
  python -m localcloud down >/dev/null 2>&1 || true
fi

echo
echo "=== make test: wall time per stage"
for stage in $STAGES; do
  printf '  %-9s %6ss  %s\n' "$stage" "${TIMES[$stage]:-0}" "${RESULTS[$stage]:-not run}"
done
exit $overall
