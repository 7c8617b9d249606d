#!/usr/bin/env bash
# ansible-test sanity from an ansible_collections/dynatrain/elastic copy.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export PATH="$ROOT/.venv/bin:$PATH"
# ansible-test bootstraps pip for its sanity venvs from a host this machine
# cannot reach; a local stand-in (ensurepip, then PyPI) takes its place.
PIP_CACHE="$HOME/.ansible/test/cache"
mkdir -p "$PIP_CACHE"
for v in 24_2 25_0 25_1; do
  [ -e "$PIP_CACHE/get_pip_$v.py" ] || cp tests/sanity/get_pip_standin.py "$PIP_CACHE/get_pip_$v.py"
done
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
DEST=$WORK/ansible_collections/dynatrain/elastic
mkdir -p "$DEST"
# Only what git tracks (plus uncommitted changes of tracked files).
git ls-files -z --cached --others --exclude-standard | rsync -a --from0 --files-from=- ./ "$DEST/"
# The inventory plugin builds on amazon.aws (doc fragments, AWSInventoryBase): the import,
# validate-modules and ansible-doc tests need it beside our collection.
AMAZON=$(python -c 'import ansible_collections.amazon.aws as m; print(list(m.__path__)[0])')
mkdir -p "$WORK/ansible_collections/amazon" && cp -r "$AMAZON" "$WORK/ansible_collections/amazon/aws"
cd "$DEST"
git init -q && git add -A >/dev/null
ansible-test sanity --python 3.11 --color no ${DT_SANITY_ARGS:-}
