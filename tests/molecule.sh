#!/usr/bin/env bash
# Every role's molecule scenario (podman driver, the local node image).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export PATH="$ROOT/.venv/bin:$PATH"
export CONTAINERS_CONF="$ROOT/localcloud/containers.conf"
rc=0
for scen in roles/*/molecule/*/molecule.yml; do
  role_dir=${scen%%/molecule/*}
  name=$(basename "$(dirname "$scen")")
  echo "--- molecule: $role_dir ($name)"
  t0=$SECONDS
  if (cd "$role_dir" && molecule test -s "$name"); then
    echo "--- molecule: $role_dir ($name) passed in $((SECONDS - t0))s"
  else
    echo "--- molecule: $role_dir ($name) FAILED after $((SECONDS - t0))s"; rc=1
  fi
done
exit $rc
