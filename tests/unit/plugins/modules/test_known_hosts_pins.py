"""dynatrain.elastic.known_hosts_pins: the controller's known_hosts of a cluster, edited under a lock
(issue 24, defect 8: two playbooks at once must keep every pin)."""
from __future__ import annotations

import json
import multiprocessing
import os
import re
from pathlib import Path

import pytest

from ansible.module_utils.testing import patch_module_args

from ansible_collections.dynatrain.elastic.plugins.modules import known_hosts_pins as khp

ROOT = Path(__file__).resolve().parents[4]
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI"


def key(n):
    return f"{KEY}{n:040d}"


def test_pinning_replaces_every_older_line_of_the_names_and_keeps_the_rest():
    text = ("# pinned by dynatrain\n10.0.0.1 " + key(1) + "\n10.0.0.2,54.0.0.2 " + key(2) + "\n54.0.0.3 " + key(3)
            + "\n@cert-authority *.example " + key(9) + "\n|1|abc=|def= " + key(8) + "\n")
    after, added, removed = khp.edit(text, [{"names": ["10.0.0.2", "54.0.0.3"], "key": key(5)}])
    assert added == ["10.0.0.2,54.0.0.3 " + key(5)]
    assert removed == ["10.0.0.2,54.0.0.2 " + key(2), "54.0.0.3 " + key(3)]
    assert after.splitlines() == ["# pinned by dynatrain", "10.0.0.1 " + key(1), "@cert-authority *.example " + key(9),
                                  "|1|abc=|def= " + key(8), "10.0.0.2,54.0.0.3 " + key(5)]
    # the same pin again changes nothing
    assert khp.edit(after, [{"names": ["10.0.0.2", "54.0.0.3"], "key": key(5) + " comment"}]) == (after, [], [])


def test_forgetting_a_name_drops_its_lines():
    text = f"10.0.0.1 {key(1)}\n10.0.0.2,54.0.0.2 {key(2)}\n[10.0.0.3]:22 {key(3)}\n"
    after, added, removed = khp.edit(text, absent=["54.0.0.2", "10.0.0.3", "10.0.0.9"])
    assert after == f"10.0.0.1 {key(1)}\n" and added == [] and len(removed) == 2


@pytest.mark.parametrize("node", [{"names": [], "key": key(1)}, {"names": ["a,b"], "key": key(1)},
                                  {"names": ["10.0.0.1"], "key": "AAAA"}, {"names": ["10.0.0.1"], "key": "rsa AAAA"}])
def test_a_bad_pin_is_refused(node):
    with pytest.raises(khp.PinError):
        khp.edit("", [node])


def _pin_many(path, first, count, forget):
    for n in range(first, first + count):
        khp.update(path, present=[{"names": [f"10.1.{n // 250}.{n % 250 + 1}"], "key": key(n)}],
                   absent=[forget], lock_timeout=60)


def test_two_playbooks_at_once_keep_every_pin(tmp_path):
    """Two (four) writers pin nodes at the same moment, each also forgetting a name nobody pinned:
    every pin is there at the end and the file is never torn."""
    path = str(tmp_path / "known_hosts")
    # spawn, never fork: pytest has threads by now (moto's server), and a forked child can inherit a
    # lock one of them held and hang for ever (it did, in CI)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_pin_many, args=(path, i * 40, 40, f"10.9.9.{i}")) for i in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    lines = Path(path).read_text().splitlines()
    assert sorted(lines) == sorted(f"10.1.{n // 250}.{n % 250 + 1} {key(n)}" for n in range(160))
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".known_hosts.")]


def test_update_needs_the_directory_and_honours_check_mode(tmp_path):
    with pytest.raises(khp.PinError, match="does not exist"):
        khp.update(str(tmp_path / "no" / "known_hosts"), present=[{"names": ["10.0.0.1"], "key": key(1)}])
    path = tmp_path / "known_hosts"
    out = khp.update(str(path), present=[{"names": ["10.0.0.1"], "key": key(1)}], check_mode=True)
    assert out["changed"] and not path.exists()
    assert khp.update(str(path), absent=["10.0.0.1"])["changed"] is False and not path.exists()


def run_module(args, capsys):
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            khp.main()
    return json.loads(capsys.readouterr().out)


def test_module_pins_then_reports_no_change_then_forgets(tmp_path, capsys):
    path = str(tmp_path / "known_hosts")
    pin = {"path": path, "present": [{"names": ["10.0.0.1", "54.0.0.1"], "key": key(1)}], "_ansible_diff": True}
    out = run_module(pin, capsys)
    assert out["changed"] and out["added"] == [f"10.0.0.1,54.0.0.1 {key(1)}"] and out["diff"]["before"] == ""
    assert run_module(pin, capsys)["changed"] is False
    out = run_module({"path": path, "absent": ["54.0.0.1"]}, capsys)
    assert out["changed"] and Path(path).read_text() == ""


def test_every_update_of_the_controllers_known_hosts_goes_through_the_module():
    """pin_host_keys, terminate, the lost master and the image builder (its discard): no unlocked read-modify-write."""
    offenders = []
    controller_roles = [ROOT / "roles" / role / "tasks" for role in ("cluster", "network", "fleet", "warm_pool", "node_image")]
    for task_file in [f for d in controller_roles for f in d.glob("*.yml")] + list((ROOT / "playbooks").glob("*.yml")):
        text = task_file.read_text()
        if "ansible.builtin.known_hosts:" in text or re.search(r"dest: .*known_hosts", text):
            offenders.append(task_file.name)
    assert offenders == []
    pins = (ROOT / "roles" / "fleet" / "tasks" / "pin_host_keys.yml").read_text()
    assert "dynatrain.elastic.known_hosts_pins:" in pins
    for role, name in (("fleet", "terminate.yml"), ("fleet", "lost_master.yml"), ("node_image", "discard.yml")):
        assert "dynatrain.elastic.known_hosts_pins:" in (ROOT / "roles" / role / "tasks" / name).read_text(), name
