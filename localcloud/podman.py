"""Thin wrapper around the podman CLI (always with our containers.conf).

The CLI rather than containers.podman/podman-py: the daemon has no Ansible
and podman's REST socket is not running here.
"""

import json
import shutil
import subprocess

from . import config


class PodmanError(RuntimeError):
    pass


def require(tool):
    """Fail with the Debian package to install when a host tool is missing."""
    if shutil.which(tool) is None:
        pkg = config.HOST_PACKAGES.get(tool, tool)
        raise PodmanError("%s not found: install it with `apt-get install %s` (or run `make setup`)" % (tool, pkg))


def run(args, check=True, timeout=120, input=None):
    proc = subprocess.run(
        ["podman"] + list(args),
        env=config.podman_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
        check=False,
    )
    if check and proc.returncode != 0:
        raise PodmanError("podman %s failed (%d): %s" % (" ".join(args[:2]), proc.returncode, proc.stderr.strip()))
    return proc


def image_exists(image=config.IMAGE):
    return run(["image", "exists", image], check=False).returncode == 0


def list_containers(home=None):
    """Our containers (label + owning state dir) as {name: state}.

    state is podman's: running, exited, created, ...
    """
    args = ["ps", "-a", "--format", "json", "--filter", "label=%s=1" % config.LABEL]
    if home:
        args += ["--filter", "label=%s=%s" % (config.HOME_LABEL, home)]
    out = run(args).stdout.strip() or "[]"
    result = {}
    for c in json.loads(out):
        names = c.get("Names") or []
        if names:
            result[names[0]] = c.get("State", "unknown")
    return result


def remove(name, timeout=10):
    # -t: sshd exits at once on SIGTERM; don't wait podman's default 10 s.
    return run(["rm", "-f", "-t", "2", name], check=False, timeout=timeout + 60)


def stop(name, timeout=30):
    """Shut the container down (systemd gets SIGRTMIN+3, SIGKILL after `timeout` s) and keep it."""
    return run(["stop", "-t", str(timeout), name], check=False, timeout=timeout + 60)


def start(name, timeout=120):
    """Boot a stopped container again: the same root file system, volumes and labels."""
    return run(["start", name], timeout=timeout)


def exec_(name, cmd, timeout=60):
    return run(["exec", name] + list(cmd), check=False, timeout=timeout)
