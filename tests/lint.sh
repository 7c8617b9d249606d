#!/usr/bin/env bash
# ansible-lint (production profile) over the collection.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
ansible-lint --profile production --offline
