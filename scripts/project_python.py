"""Which of the project's two Python environments runs a repository script.

`make setup` builds two: `.venv` (the controller's: Ansible, boto3, moto, the runtime) and
`.localcloud/node-venv` (a node's: MXNet, PyTorch, the runtime). A script's usage line names one, but a user
may type the script alone (its #! line: the first python3 on PATH) or with another python. ``require`` moves
such a run to the script's environment when what it imports is missing, before the first import fails with a
traceback; where that environment does not exist yet, it says to run `make setup`.
"""
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENVS = {"controller": ".venv", "node": os.path.join(".localcloud", "node-venv")}


def require(venv, *modules):
    """Go on when this Python imports every one of ``modules`` (top-level names); else re-run this very
    command line with ``venv``'s python (controller or node), or exit saying how to make it."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not missing:
        return
    home = os.path.join(ROOT, VENVS[venv])
    python = os.path.join(home, "bin", "python")
    # (a venv that lacks them too stops here instead of running itself again)
    if os.path.realpath(sys.prefix) != os.path.realpath(home) and os.access(python, os.X_OK):
        sys.stdout.flush()
        os.execv(python, [python, os.path.abspath(sys.argv[0])] + sys.argv[1:])
    sys.exit("%s needs %s, which %s lacks: run `make setup` at %s (it builds the project's environments, %s "
             "among them), then the same command again."
             % (os.path.basename(sys.argv[0]), ", ".join(missing), sys.executable, ROOT, VENVS[venv]))
