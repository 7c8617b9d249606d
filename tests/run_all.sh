#!/usr/bin/env bash
# `make test`: every stage, with its wall time printed at the end.
# Stages: lint (ansible-lint + argument-spec drift), sanity (ansible-test),
# unit (pytest tests/unit), molecule (every role scenario), e2e (local cloud).
# DT_TEST_STAGES="unit e2e" runs a subset (one stage after another unless unit, molecule and e2e are
# all in it).
#
# With every stage selected they run in two lanes, as far as the 2 cores allow:
#   cloud   (background) the e2e first (the longest stage: started at once), then the molecule
#           scenarios on the local cloud (cluster, checkpoint_bucket, node_image: each molecule.yml with
#           the default driver): the only users of the local cloud, one after the other (one account on
#           one fixed port);
#   main    unit, then lint and sanity;
# then each lane, once free, takes role scenarios (each in its own container and network namespace):
# the next one nobody has taken (mkdir of a claim), the longest first.
# The e2e alone leaves about a core idle (its playbooks wait on SSH, its jobs sleep per step): the
# unit tests and the checks beside it use that core (docs/INTERNALS.md: both arrangements measured).
# The background lanes' output goes to tests/output/<lane>.log, printed when the lane ends.
# DT_TEST_SERIAL=1 runs every stage one after another.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export PATH="$ROOT/.venv/bin:$PATH"
export CONTAINERS_CONF="$ROOT/localcloud/containers.conf"
export ANSIBLE_CONFIG="$ROOT/ansible.cfg"
STAGES=${DT_TEST_STAGES:-"lint sanity unit molecule e2e"}
OUT=$ROOT/tests/output
STATUS=$OUT/stages                # one line per finished stage: NAME RC SECONDS
mkdir -p "$OUT"
: >"$STATUS"
overall=0

selected() { [[ " $STAGES " == *" $1 "* ]]; }

# stage NAME CMD...: runs one stage; its wall time and result go to the table at the end.
# Its output also goes to tests/output/stage-NAME.log, whose end is printed again after the table when
# it fails (CI shows the last lines of a run: the lanes' logs come before the table).
stage() {
  local name=$1 rc; shift
  echo "=== stage $name: $*"
  local t0=$SECONDS
  "$@" 2>&1 | tee "$OUT/stage-$name.log"
  rc=${PIPESTATUS[0]}
  echo "$name $rc $((SECONDS - t0))" >>"$STATUS"
}

# why_failed NAME: a few lines of a failed stage's log that say why, ANSI colours removed: pytest's
# failed assertion (its `E` lines that name a failure) and its summary line, or else the last lines
# (molecule's and the checks').
why_failed() {
  local log="$OUT/stage-$1.log" plain lines
  [ -f "$log" ] || return 0
  plain=$(sed 's/\x1b\[[0-9;]*m//g' "$log")
  lines=$(grep -E '^E  ' <<<"$plain" | grep -iE 'fatal|error|fail|assert|msg' | tail -n 8
          grep -E '^(FAILED|ERROR) ' <<<"$plain" | tail -n 3)
  [ -n "$lines" ] || lines=$(grep -v '^\s*$' <<<"$plain" | tail -n 10)
  echo "=== why $1 failed (the end of tests/output/stage-$1.log)"
  printf '%s\n' "$lines" | cut -c1-300
}

# `scenarios cloud|roles`: those on the local cloud use molecule's delegated (`default`) driver,
# the others a podman container of their own.
scenarios() {
  local f kind
  for f in molecule/*/molecule.yml; do
    [ "$(basename "$(dirname "$f")")" = lifecycle ] && continue    # on demand (tests/molecule.sh)
    kind=roles; grep -q "^  name: default" "$f" && kind=cloud
    [ "$kind" = "$1" ] && printf '%s ' "$(basename "$(dirname "$f")")"
  done
}

# --timeout: a hung test fails with its traceback; --durations: where the stage's time went.
unit() { python -m pytest tests/unit -q -p no:cacheprovider --timeout=900 --durations=25; }
# Every e2e module on the local cloud, the torch engine's lifecycle (tests/e2e/test_torch_engine.py)
# included: one after the other in the cloud lane.
e2e() { python -m pytest tests/e2e -q -p no:cacheprovider -x --durations=10; }
molecule_cloud() { DT_MOLECULE_SCENARIOS="$(scenarios cloud)" bash tests/molecule.sh; }
# role_scenarios: the role scenarios this lane takes (mkdir of tests/output/claims/NAME: the first lane
# to ask gets it), the longest first so that the two lanes end about together.
LONGEST_FIRST="torch launcher mxnet"
role_scenarios() {
  local s rc=0 all
  all="$LONGEST_FIRST $(scenarios roles)"
  for s in $all; do
    [[ " $(scenarios roles) " == *" $s "* ]] || continue
    mkdir "$OUT/claims/$s" 2>/dev/null || continue
    DT_MOLECULE_SCENARIOS=$s bash tests/molecule.sh || rc=1
  done
  return $rc
}

cloud_lane() {
  stage e2e e2e
  stage molecule-cloud molecule_cloud
  stage roles@cloud role_scenarios
}
main_lane() {
  local s
  stage unit unit
  for s in lint sanity; do
    selected $s && stage $s bash "tests/$s.sh"
  done
  stage roles@main role_scenarios
}

# background LANE: runs LANE_lane in the background, its output in tests/output/LANE.log.
LANES=() PIDS=()
background() {
  echo "=== lane $1 (background, output in tests/output/$1.log)"
  "$1_lane" >"$OUT/$1.log" 2>&1 &
  LANES+=("$1") PIDS+=($!)
}
join_lanes() {
  local i
  for i in "${!PIDS[@]}"; do
    wait "${PIDS[$i]}"
    echo "=== lane ${LANES[$i]}: its output"
    cat "$OUT/${LANES[$i]}.log"
  done
}

# The torch engine's node wheels (python -m localcloud wheelhouse --engine torch: PyTorch's CPU build,
# 192 MB; nothing when present), fetched once before the stages that use them. The torch molecule
# scenario asks for them too, but fetched then they would arrive in the controller wheelhouse while an
# e2e module runs, and its wheel names are part of a baked image's recipe: an image baked before they
# arrived would be stale for that module's next bootstrap. (The torch e2e starts from a copy of the
# wheelhouse without them: its bootstrap builds them on demand.)
if selected molecule || selected e2e; then
  python -m localcloud wheelhouse --engine torch || overall=1
fi

if selected unit && selected molecule && selected e2e && [ -z "${DT_TEST_SERIAL:-}" ] \
    && [ -z "${DT_MOLECULE_SCENARIOS:-}" ]; then
  rm -rf "$OUT/claims" && mkdir -p "$OUT/claims"
  background cloud
  main_lane
  join_lanes
  lanes=1
else
  for s in $STAGES; do
    case $s in
      lint|sanity) stage "$s" bash "tests/$s.sh" ;;
      unit) stage unit unit ;;
      molecule) stage molecule bash tests/molecule.sh ;;
      e2e) stage e2e e2e ;;
      *) echo "unknown stage $s"; echo "$s 2 0" >>"$STATUS" ;;
    esac
  done
  lanes=0
fi

# Nothing stays behind: the cluster molecule scenarios and the e2e share the local cloud.
if [ -z "${DT_KEEP_CLOUD:-}" ] || [ "${DT_KEEP_CLOUD}" = 0 ]; then
  python -m localcloud down >/dev/null 2>&1 || true
fi

echo
echo "=== make test: wall time per stage"
while read -r name rc secs; do
  [ "$rc" -eq 0 ] || overall=1
  printf '  %-14s %6ss  %s\n' "$name" "$secs" "$([ "$rc" -eq 0 ] && echo pass || echo "FAIL (rc=$rc)")"
done <"$STATUS"
[ $lanes = 1 ] && echo "  (the e2e, then molecule-cloud, beside unit, lint and sanity; then the role scenarios in both lanes)"
echo "  total          ${SECONDS}s"
while read -r name rc _; do
  [ "$rc" -eq 0 ] || why_failed "$name"
done <"$STATUS"
exit $overall
