"""plugins/module_utils/console_host_keys.py: fingerprints from console text (cloud-init's
block, EC2's `ec2: ` prefix) and a scanned key checked against them, with real keys made
by ssh-keygen."""
from __future__ import annotations

import subprocess

import pytest

from ansible_collections.dynatrain.elastic.plugins.module_utils.console_host_keys import (
    console_fingerprints, key_fingerprint, verdict)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """Two ed25519 keys: (public key line, ssh-keygen's fingerprint line)."""
    out = []
    for name in ("a", "b"):
        path = tmp_path_factory.mktemp("k") / name
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "root@ip-" + name, "-f", str(path)],
                       check=True)
        fp_line = subprocess.run(["ssh-keygen", "-l", "-f", str(path) + ".pub"], check=True, capture_output=True,
                                 text=True).stdout.strip()
        out.append(((path.parent / (name + ".pub")).read_text().strip(), fp_line))
    return out


def _console(*fp_lines, prefix="ec2: "):
    lines = ["Linux version 6.1.0-13-cloud-amd64", "Cloud-init v. 22.4.2 finished"]
    lines.append(prefix + "#" * 61)
    lines.append(prefix + "-----BEGIN SSH HOST KEY FINGERPRINTS-----")
    lines += [prefix + fp for fp in fp_lines]
    lines.append(prefix + "-----END SSH HOST KEY FINGERPRINTS-----")
    return "\n".join(lines) + "\n"


def test_key_fingerprint_is_ssh_keygens(keys):
    for pub, fp_line in keys:
        assert key_fingerprint(pub) == fp_line.split()[1]
        # ssh-keyscan's form: the host first
        assert key_fingerprint("10.0.0.5 " + pub) == fp_line.split()[1]


def test_console_fingerprints_with_and_without_the_ec2_prefix(keys):
    fps = [pair[1] for pair in keys]
    for prefix in ("ec2: ", ""):
        listed = console_fingerprints(_console(*fps, prefix=prefix))
        assert listed == {fp.split()[1]: "ED25519" for fp in fps}


def test_no_block_or_an_unfinished_block_lists_nothing(keys):
    assert console_fingerprints("Linux version 6.1\nno keys here\n") == {}
    assert console_fingerprints("") == {} and console_fingerprints(None) == {}
    unfinished = _console(keys[0][1]).rsplit("ec2: -----END", 1)[0]
    assert console_fingerprints(unfinished) == {}


def test_the_last_block_wins(keys):
    text = _console(keys[0][1]) + _console(keys[1][1])
    assert list(console_fingerprints(text)) == [keys[1][1].split()[1]]


def test_verdicts(keys):
    (pub_a, fp_a), (pub_b, fp_b) = keys
    assert verdict(pub_a, _console(fp_a, fp_b)) == ("console", fp_a.split()[1])
    assert verdict(pub_a, _console(fp_b)) == ("mismatch", fp_a.split()[1])
    assert verdict(pub_a, "no fingerprints") == ("none", fp_a.split()[1])


def test_a_line_without_a_key_is_refused():
    with pytest.raises(ValueError, match="not an OpenSSH public key"):
        key_fingerprint("# 10.0.0.5:22 SSH-2.0-OpenSSH_9.2p1")
