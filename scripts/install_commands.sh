#!/usr/bin/env bash
# make setup: the README's commands (ansible-playbook, ansible, ansible-inventory, ansible-galaxy,
# molecule) in a plain shell, without `source .venv/bin/activate`. Each is a small script in
# /usr/local/bin that runs the command from the .venv of the checkout you are in (a directory with
# galaxy.yml and .venv above $PWD), with that venv first on PATH as `activate` would put it; outside
# a checkout it uses this one's. Installed only where no other command of that name is on PATH (a
# user's own Ansible is never shadowed) and the directory is writable; a second run changes nothing.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${DT_COMMANDS_DIR:-/usr/local/bin}
MARK="dynatrain.elastic: run from the checkout's .venv"
for cmd in ansible-playbook ansible ansible-inventory ansible-galaxy molecule; do
  target=$BIN/$cmd
  if [ -e "$target" ] && ! grep -qs "$MARK" "$target"; then
    echo "commands: $target is not ours, left alone (source $ROOT/.venv/bin/activate to use the collection's)"
    continue
  fi
  found=$(PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -vx "$ROOT/.venv/bin" | paste -sd:) command -v "$cmd" || true)
  if [ -n "$found" ] && [ "$found" != "$target" ]; then
    echo "commands: $cmd is $found, left alone (source $ROOT/.venv/bin/activate to use the collection's)"
    continue
  fi
  if [ ! -w "$BIN" ]; then
    echo "commands: $BIN is not writable; source $ROOT/.venv/bin/activate for $cmd"
    continue
  fi
  body=$(cat <<SCRIPT
#!/bin/sh
# $MARK (scripts/install_commands.sh, make setup).
d=\$PWD
while :; do
  if [ -f "\$d/galaxy.yml" ] && [ -x "\$d/.venv/bin/$cmd" ]; then break; fi
  if [ "\$d" = / ]; then d=$ROOT; break; fi
  d=\$(dirname "\$d")
done
PATH="\$d/.venv/bin:\$PATH" VIRTUAL_ENV="\$d/.venv" exec "\$d/.venv/bin/$cmd" "\$@"
SCRIPT
)
  if [ "$(cat "$target" 2>/dev/null)" != "$body" ]; then
    printf '%s\n' "$body" >"$target.tmp.$$" && chmod 755 "$target.tmp.$$" && mv "$target.tmp.$$" "$target"
    echo "commands: $target"
  fi
done
