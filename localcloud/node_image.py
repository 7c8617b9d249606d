"""Build the node image `localhost/dynatrain-node:bookworm` without a registry.

debootstrap a minimal bookworm, configure it like a Debian cloud image
(user `admin`, passwordless sudo, hardened sshd, no host keys, systemd as
PID 1, empty apt lists), then `tar | podman import`. Cached: nothing happens
when the image exists and was built from the same recipe (label RECIPE_LABEL);
a changed recipe rebuilds it.
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

from . import config, podman

MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
PACKAGES = [
    "openssh-server",
    "openssh-client",
    "python3",
    "python3-venv",
    "python3-apt",
    "sudo",
    "iproute2",
    "procps",
    "pciutils",
    "ca-certificates",
    "rsync",
    "util-linux",
    # Nodes boot like EC2 instances: systemd is PID 1 and runs sshd, the launcher,
    # the spot watcher (Restart=on-failure) - one unit file locally and on AWS.
    "systemd",
    "systemd-sysv",
    "dbus",
    # libgomp1, libquadmath0: runtimes the MXNet/scikit-learn wheels expect on the system.
    "libgomp1",
    "libquadmath0",
    # python3-debian: ansible.builtin.deb822_repository (cuda role) needs it.
    "python3-debian",
    # small tools the roles and humans expect on a cloud image
    "iputils-ping",
    "netcat-openbsd",
    "less",
    "gnupg",
    "curl",
    "lsb-release",
    "locales",
]

SSHD_CONFIG = """\
# localcloud: hardened like our AWS nodes (docs/security.md).
# localcloud-init writes the instance's private IP as ListenAddress (sshd_config.d).
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
PubkeyAuthentication yes
X11Forwarding no
AllowAgentForwarding no
PermitEmptyPasswords no
HostKey /etc/ssh/ssh_host_ed25519_key
HostKey /etc/ssh/ssh_host_ecdsa_key
"""

APT_SOURCES = """\
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


MASKED_UNITS = [
    "getty@tty1.service",
    "console-getty.service",
    "systemd-udevd.service",
    "systemd-udev-trigger.service",
    "systemd-modules-load.service",
    "systemd-remount-fs.service",
    "sys-kernel-debug.mount",
    "sys-kernel-tracing.mount",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "e2scrub_all.timer",
    "fstrim.timer",
]

# Bumps whenever what the image holds changes: `build` rebuilds an image whose
# label differs, so a checkout never runs nodes from an older recipe.
RECIPE_LABEL = "dynatrain.localcloud.recipe"
NODE_FILES = ("localcloud-init", "localcloud-init.service")


def recipe_digest():
    """This file (packages, configuration) and the files it copies into the image."""
    h = hashlib.sha256()
    for path in [__file__] + [os.path.join(config.PACKAGE_DIR, "node", n) for n in NODE_FILES]:
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def image_recipe(image=config.IMAGE):
    r = podman.run(["image", "inspect", "--format", "{{index .Labels \"%s\"}}" % RECIPE_LABEL, image], check=False)
    return r.stdout.strip() if r.returncode == 0 else None


def _say(msg):
    print("build-image: %s" % msg, flush=True)


def _chroot(root, *cmd):
    subprocess.run(
        ["chroot", root] + list(cmd), check=True, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
    )


def _write(root, path, text, mode=0o644):
    full = os.path.join(root, path.lstrip("/"))
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w") as f:
        f.write(text)
    os.chmod(full, mode)


def configure_rootfs(root):
    """Everything a Debian cloud image has that minbase lacks (no secrets)."""
    _chroot(root, "useradd", "--create-home", "--shell", "/bin/bash", "--groups", "sudo", "admin")
    # '*' = no password, but not "locked": pubkey login works with or without PAM.
    _chroot(root, "usermod", "-p", "*", "admin")
    _write(root, "/etc/sudoers.d/90-admin", "admin ALL=(ALL) NOPASSWD:ALL\n", 0o440)
    _write(root, "/etc/ssh/sshd_config.d/10-localcloud.conf", SSHD_CONFIG)
    for name in os.listdir(os.path.join(root, "etc/ssh")):
        if name.startswith("ssh_host_"):
            os.remove(os.path.join(root, "etc/ssh", name))
    # deb822 sources, like Debian's own cloud images.
    sources_list = os.path.join(root, "etc/apt/sources.list")
    if os.path.exists(sources_list):
        os.remove(sources_list)
    _write(root, "/etc/apt/sources.list.d/debian.sources", APT_SOURCES)
    _write(root, "/etc/locale.gen", "en_US.UTF-8 UTF-8\nC.UTF-8 UTF-8\n")
    _chroot(root, "locale-gen")
    _write(root, "/etc/default/locale", "LANG=C.UTF-8\n")
    # The node has no network of its own for services to start at install time;
    # nothing to start at build time either.
    _write(
        root,
        "/etc/localcloud/image",
        "%s built %s\n" % (config.IMAGE, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())),
    )
    init_src = os.path.join(config.PACKAGE_DIR, "node", "localcloud-init")
    shutil.copyfile(init_src, os.path.join(root, "usr/local/sbin/localcloud-init"))
    os.chmod(os.path.join(root, "usr/local/sbin/localcloud-init"), 0o755)
    # What cloud-init does at first boot, as a oneshot unit ordered before sshd.
    unit_src = os.path.join(config.PACKAGE_DIR, "node", "localcloud-init.service")
    shutil.copyfile(unit_src, os.path.join(root, "etc/systemd/system/localcloud-init.service"))
    _chroot(root, "systemctl", "enable", "localcloud-init.service", "ssh.service")
    # Units that have nothing to do in a container sharing the host's network and
    # devices (and would mark the node "degraded").
    _chroot(root, "systemctl", "mask", *MASKED_UNITS)
    # Image size: package caches and lists are not needed at run time.
    for d in ("var/cache/apt/archives", "var/lib/apt/lists"):
        full = os.path.join(root, d)
        for name in os.listdir(full):
            p = os.path.join(full, name)
            if os.path.isfile(p):
                os.remove(p)
    _write(root, "/etc/machine-id", "")


def build(force=False):
    for tool in ("podman", "runc"):
        podman.require(tool)
    digest = recipe_digest()
    have = image_recipe() if podman.image_exists() else None
    if have == digest and not force:
        _say("%s already exists (use --force to rebuild)" % config.IMAGE)
        return 0
    # only a build needs it (/usr/sbin: not on every user's PATH, and not needed to reuse the image)
    podman.require("debootstrap")
    if have is not None and have != digest:
        _say("%s was built from another recipe (%s, now %s): rebuilding" % (config.IMAGE, have or "none", digest))
    if os.geteuid() != 0:
        raise podman.PodmanError("build-image needs root (debootstrap, chroot)")
    start = time.monotonic()
    previous = podman.run(["image", "inspect", "--format", "{{.Id}}", config.IMAGE], check=False).stdout.strip()
    os.makedirs(config.home(), exist_ok=True)
    work = tempfile.mkdtemp(prefix="image-", dir=config.home())
    root = os.path.join(work, "rootfs")
    try:
        _say("debootstrap %s (minbase + %d packages) from %s ..." % (SUITE, len(PACKAGES), MIRROR))
        log = os.path.join(work, "debootstrap.log")
        with open(log, "w") as f:
            proc = subprocess.run(
                ["debootstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES), SUITE, root, MIRROR],
                stdout=f,
                stderr=subprocess.STDOUT,
                check=False,
            )
        if proc.returncode != 0:
            with open(log) as f:
                tail = f.read()[-3000:]
            raise podman.PodmanError("debootstrap failed:\n" + tail)
        _say("debootstrap done after %.0f s; configuring rootfs" % (time.monotonic() - start))
        configure_rootfs(root)
        _say("importing into podman as %s" % config.IMAGE)
        tar = subprocess.Popen(["tar", "-C", root, "--numeric-owner", "-cf", "-", "."], stdout=subprocess.PIPE)
        imp = subprocess.run(
            [
                "podman",
                "import",
                "--change",
                'CMD ["/sbin/init"]',
                "--change",
                "STOPSIGNAL SIGRTMIN+3",
                "--change",
                "ENV LANG=C.UTF-8 container=podman",
                "--change",
                "LABEL %s=%s" % (RECIPE_LABEL, digest),
                "--message",
                "dynatrain localcloud node (debootstrap %s)" % SUITE,
                "-",
                config.IMAGE,
            ],
            stdin=tar.stdout,
            env=config.podman_env(),
            capture_output=True,
            text=True,
            check=False,
        )
        tar.stdout.close()
        tar.wait()
        if tar.returncode != 0 or imp.returncode != 0:
            raise podman.PodmanError("podman import failed: %s" % imp.stderr.strip())
        if previous:
            # The old, now untagged image: gone unless a container still uses it.
            podman.run(["rmi", previous], check=False)
        _say("built %s in %.0f s" % (config.IMAGE, time.monotonic() - start))
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(build("--force" in sys.argv))
