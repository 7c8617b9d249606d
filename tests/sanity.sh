#!/usr/bin/env bash
# ansible-test sanity from an ansible_collections/dynatrain/elastic copy.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export PATH="$ROOT/.venv/bin:$PATH"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
DEST=$WORK/ansible_collections/dynatrain/elastic
mkdir -p "$DEST"
# Only what git tracks (plus uncommitted changes of tracked files).
git ls-files -z --cached --others --exclude-standard | rsync -a --from0 --files-from=- ./ "$DEST/"
cd "$DEST"
git init -q && git add -A >/dev/null
ansible-test sanity --python 3.11 --color no \
  --skip-test pylint --skip-test mypy --skip-test import --skip-test validate-modules \
  ${DT_SANITY_ARGS:-}
ansible-test sanity --python 3.11 --color no --test validate-modules --test import ${DT_SANITY_ARGS:-}
