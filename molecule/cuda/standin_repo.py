#!/usr/bin/env python3
"""Build a tiny signed flat apt repository that stands in for NVIDIA's.

Molecule has no route to developer.download.nvidia.com, so the cuda role is
converged against this repository, served on loopback inside the test
container. The packages are empty shells named like the real ones; two
versions of nvidia-driver exist so the role's apt pin is really exercised (the
pinned, older version must win), and both kernel-module flavours exist so the
role's choice is visible. It also stands in for the Debian archive's contrib
component (an empty suite under debian/, signed by the same key).

Usage: standin_repo.py OUTDIR KERNEL_RELEASE
Writes OUTDIR/{*.deb,Packages,Packages.gz,Release,InRelease,Release.gpg,key.asc,fingerprint}
and OUTDIR/debian/dists/bookworm/{InRelease,contrib/binary-amd64/Packages}.
"""
import email.utils
import gzip
import hashlib
import os
import subprocess
import sys
import tempfile


def packages(kernel):
    return [
        # name, version, depends, files {path: (content, mode)}
        ("nvidia-driver", "550.54.15-1", "", {}),
        ("nvidia-driver", "560.35.03-1", "", {}),
        ("nvidia-kernel-open-dkms", "550.54.15-1", "", {}),
        ("nvidia-kernel-dkms", "550.54.15-1", "", {}),
        ("cuda-drivers-550", "550.54.15-1",
         "nvidia-driver (>= 550), nvidia-kernel-open-dkms (>= 550) | nvidia-kernel-dkms (>= 550)", {}),
        ("cuda-drivers-560", "560.35.03-1", "nvidia-driver (>= 560)", {}),
        ("linux-headers-" + kernel, "1.0-1", "", {}),
    ]


def build_deb(outdir, name, version, depends, files):
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "DEBIAN"))
        for rel, (content, mode) in files.items():
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as fh:
                fh.write(content)
            os.chmod(path, mode)
        control = [
            "Package: " + name,
            "Version: " + version,
            "Architecture: amd64",
            "Maintainer: dynatrain molecule <standin@localhost>",
            "Section: misc",
            "Priority: optional",
        ]
        if depends:
            control.append("Depends: " + depends)
        control.append("Description: dynatrain stand-in for NVIDIA's " + name)
        with open(os.path.join(root, "DEBIAN", "control"), "w") as fh:
            fh.write("\n".join(control) + "\n")
        deb = "%s_%s_amd64.deb" % (name, version)
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", root,
                        os.path.join(outdir, deb)], check=True, stdout=subprocess.DEVNULL)
        return deb, control


def main():
    outdir, kernel = sys.argv[1], sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    stanzas = []
    for name, version, depends, files in packages(kernel):
        deb, control = build_deb(outdir, name, version, depends, files)
        data = open(os.path.join(outdir, deb), "rb").read()
        stanzas.append("\n".join(control[:-1] + [
            "Filename: ./" + deb,
            "Size: %d" % len(data),
            "SHA256: " + hashlib.sha256(data).hexdigest(),
            control[-1],
        ]))
    index = ("\n\n".join(stanzas) + "\n").encode()
    with open(os.path.join(outdir, "Packages"), "wb") as fh:
        fh.write(index)
    with open(os.path.join(outdir, "Packages.gz"), "wb") as fh:
        fh.write(gzip.compress(index, mtime=0))
    lines = [
        "Origin: dynatrain-standin",
        "Label: cuda-standin",
        "Architectures: amd64",
        "Date: " + email.utils.formatdate(usegmt=True),
        "SHA256:",
    ]
    for fname in ("Packages", "Packages.gz"):
        data = open(os.path.join(outdir, fname), "rb").read()
        lines.append(" %s %d %s" % (hashlib.sha256(data).hexdigest(), len(data), fname))
    with open(os.path.join(outdir, "Release"), "w") as fh:
        fh.write("\n".join(lines) + "\n")

    # Sign with a throw-away key (no passphrase, lives only in this container).
    gnupghome = tempfile.mkdtemp(prefix="gnupg-")
    env = dict(os.environ, GNUPGHOME=gnupghome)
    gpg = ["gpg", "--batch", "--quiet", "--pinentry-mode", "loopback", "--passphrase", ""]
    subprocess.run(gpg + ["--quick-gen-key", "dynatrain stand-in <standin@localhost>",
                          "ed25519", "sign", "never"], check=True, env=env)
    with open(os.path.join(outdir, "key.asc"), "wb") as fh:
        fh.write(subprocess.run(gpg + ["--armor", "--export"], check=True, env=env,
                                stdout=subprocess.PIPE).stdout)
    colons = subprocess.run(gpg + ["--with-colons", "--fingerprint"], check=True, env=env,
                            stdout=subprocess.PIPE).stdout.decode()
    fpr = next(line.split(":")[9] for line in colons.splitlines() if line.startswith("fpr:"))
    with open(os.path.join(outdir, "fingerprint"), "w") as fh:
        fh.write(fpr + "\n")
    sign(gpg, env, outdir)
    sign(gpg, env, contrib_suite(outdir))
    subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=env, check=False)


def sign(gpg, env, directory):
    release = os.path.join(directory, "Release")
    subprocess.run(gpg + ["--yes", "--clearsign", "-o", os.path.join(directory, "InRelease"),
                          release], check=True, env=env)
    subprocess.run(gpg + ["--yes", "-abs", "-o", os.path.join(directory, "Release.gpg"), release],
                   check=True, env=env)


def contrib_suite(outdir):
    """An empty bookworm suite with a contrib component: the role's Debian contrib source."""
    suite = os.path.join(outdir, "debian", "dists", "bookworm")
    os.makedirs(os.path.join(suite, "contrib", "binary-amd64"), exist_ok=True)
    rel = "contrib/binary-amd64/Packages"
    open(os.path.join(suite, rel), "wb").close()
    lines = ["Origin: Debian", "Label: Debian", "Suite: stable", "Codename: bookworm",
             "Architectures: amd64", "Components: contrib",
             "Date: " + email.utils.formatdate(usegmt=True), "SHA256:",
             " %s 0 %s" % (hashlib.sha256(b"").hexdigest(), rel)]
    with open(os.path.join(suite, "Release"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    return suite


if __name__ == "__main__":
    main()
