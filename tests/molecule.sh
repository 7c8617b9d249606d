#!/usr/bin/env bash
# Every molecule scenario (molecule/<name>: one per role, podman driver and the
# local node image; the cluster, checkpoint_bucket and node_image roles' on the local cloud), run from the repository
# root as `molecule test -s NAME`, each with its wall time.
# DT_MOLECULE_SCENARIOS="node_base lifecycle" runs those. The cluster-level `lifecycle`
# (bootstrap, its idempotence, add, status, remove, teardown as typed) runs only when
# named: make test's e2e does all of it on one shared cluster (tests/e2e/test_elastic.py).
ON_DEMAND=" lifecycle "
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export PATH="$ROOT/.venv/bin:$PATH"
export CONTAINERS_CONF="$ROOT/localcloud/containers.conf"
scenarios=${DT_MOLECULE_SCENARIOS:-$(for f in molecule/*/molecule.yml; do
  name=$(basename "$(dirname "$f")"); [[ "$ON_DEMAND" == *" $name "* ]] || echo "$name"; done)}
rc=0
for name in $scenarios; do
  echo "--- molecule: $name"
  t0=$SECONDS
  if molecule test -s "$name"; then
    echo "--- molecule: $name passed in $((SECONDS - t0))s"
  else
    echo "--- molecule: $name FAILED after $((SECONDS - t0))s"; rc=1
  fi
done
exit $rc
