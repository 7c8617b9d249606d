"""Unit tests for the dynatrain.elastic.host_worker module (no network)."""
import json
import multiprocessing
import os
import stat
import threading
import time

import pytest

from ansible.module_utils.testing import patch_module_args

from ansible_collections.dynatrain.elastic.plugins.module_utils import shared_volume as hwf
from ansible_collections.dynatrain.elastic.plugins.modules import host_worker

MASTER = "10.0.0.1"


@pytest.fixture
def efs(tmp_path):
    """A fake shared volume with host_worker (two base workers + master) and an empty log."""
    path = tmp_path / "host_worker"
    path.write_text("# base workers\n10.0.0.2\n10.0.0.3\n# master\n10.0.0.1\n")
    os.chmod(str(path), 0o664)
    (tmp_path / "host_worker_log").write_text("0 ADDED 10.0.0.2 1\n1 ADDED 10.0.0.3 2\n")
    return tmp_path


def params(efs, **kw):
    out = dict(path=str(efs / "host_worker"), hosts=[], state="present", wait=False, timeout=5,
               protected=[], master=None, log_path=None, launcher_log=None, lock_timeout=5)
    out.update(kw)
    return out


def run(p, **kw):
    kw.setdefault("poll_interval", 0.02)
    return host_worker.run(p, **kw)


def text(efs):
    return (efs / "host_worker").read_text()


def append_later(log, lines, delay):
    """Like the launcher: log the lines once host_worker was edited (then `delay` s), so that
    a slow run (a busy machine) cannot record its log position after they were written."""
    host_worker = os.path.join(os.path.dirname(log), "host_worker")

    def read():
        try:
            with open(host_worker) as handle:
                return handle.read()
        except OSError:
            return None

    before = read()

    def go():
        deadline = time.time() + 5
        while read() == before and time.time() < deadline:
            time.sleep(0.02)
        time.sleep(delay)
        with open(log, "a") as handle:
            for line in lines:
                handle.write(line + "\n")
    t = threading.Thread(target=go)
    t.start()
    return t


# --- add / remove / idempotence -------------------------------------------------------


def test_add_inserts_before_master_and_keeps_mode(efs):
    res = run(params(efs, hosts=["10.0.0.4", "10.0.0.5", "10.0.0.4"]))
    assert res["changed"] is True
    assert res["added"] == ["10.0.0.4", "10.0.0.5"]
    assert res["removed"] == []
    assert res["hosts"] == ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", MASTER]
    assert res["master"] == MASTER
    assert text(efs) == "# base workers\n10.0.0.2\n10.0.0.3\n# master\n10.0.0.4\n10.0.0.5\n10.0.0.1\n"
    assert stat.S_IMODE(os.stat(str(efs / "host_worker")).st_mode) == 0o664
    assert (efs / "host_worker.lock").exists()
    assert res["events"] == [] and res["waited_s"] == 0.0


def test_add_is_idempotent(efs):
    run(params(efs, hosts=["10.0.0.4"]))
    before = text(efs)
    res = run(params(efs, hosts=["10.0.0.4", "10.0.0.2", MASTER]))
    assert res["changed"] is False
    assert res["added"] == []
    assert text(efs) == before


def test_warm_writes_a_request_per_joiner_before_the_edit(efs):
    """add_workers' warm requests (shared_volume's format): one per host the edit adds, written before it,
    none for a host already there, none in check mode, and the launcher's reader reads them back."""
    warm = efs / "control" / "warm"
    seen = []
    real = host_worker.write_warm_request

    def spy(files, ip, **info):
        seen.append((ip, text(efs).count(ip)))          # the edit has not happened yet
        real(files, ip, **info)
    host_worker.write_warm_request = spy
    try:
        res = run(params(efs, hosts=["10.0.0.4", "10.0.0.2"], master=MASTER, warm=True))
    finally:
        host_worker.write_warm_request = real
    assert res["warmed"] == ["10.0.0.4"] and res["added"] == ["10.0.0.4"]
    assert seen == [("10.0.0.4", 0)]
    requests = hwf.read_warm_requests(hwf.JobFiles(str(efs)))
    assert list(requests) == ["10.0.0.4"]
    assert requests["10.0.0.4"]["ttl"] == hwf.WARM_TTL and requests["10.0.0.4"]["reason"] == "add_workers"
    assert run(params(efs, hosts=["10.0.0.4"], warm=True))["warmed"] == []      # already a member
    res = run(params(efs, hosts=["10.0.0.6"], warm=True), check_mode=True)
    assert res["warmed"] == [] and sorted(os.listdir(warm)) == ["10.0.0.4.json"]
    assert run(params(efs, hosts=["10.0.0.7"]))["warmed"] == []                 # warm not asked for


def test_edit_false_writes_the_warm_requests_alone_once_the_required_markers_are_there(efs):
    """configure_nodes' step for a worker from the warm pool: its data marker checked, its warm request written,
    host_worker left as it is (the edit comes later, and finds the process warmer)."""
    warm = efs / "control" / "warm"
    before = text(efs)
    pooled = dict(hosts=["10.0.0.8"], warm=True, edit=False, require="prepare_data_success_{ip}")
    with pytest.raises(host_worker.HostWorkerFailure, match="prepare_data_success_10.0.0.8 missing"):
        run(params(efs, **pooled))
    assert not warm.exists() and text(efs) == before                 # no marker: nothing written
    (efs / "prepare_data_success_10.0.0.8").write_text("")
    res = run(params(efs, **pooled), check_mode=True)
    assert res["warmed"] == [] and not warm.exists()
    res = run(params(efs, **pooled))
    assert res["warmed"] == ["10.0.0.8"] and res["changed"] is True and res["added"] == []
    assert sorted(os.listdir(warm)) == ["10.0.0.8.json"] and text(efs) == before
    assert res["confirm"] is None                                   # nothing to wait for
    assert run(params(efs, hosts=["10.0.0.2"], warm=True, edit=False))["warmed"] == []   # a member already
    res = run(params(efs, hosts=["10.0.0.8"], warm=True, require="prepare_data_success_{ip}"))   # the edit
    assert res["added"] == ["10.0.0.8"] and "10.0.0.8" in text(efs)


def test_require_data_checks_the_contract_s_marker(efs):
    """The playbooks ask for the data marker by require_data: its name is the shared volume contract's."""
    with pytest.raises(host_worker.HostWorkerFailure, match=hwf.prepare_data_marker("10.0.0.8") + " missing"):
        run(params(efs, hosts=["10.0.0.8"], require_data=True))
    assert "10.0.0.8" not in text(efs)
    (efs / hwf.prepare_data_marker("10.0.0.8")).write_text("")
    assert run(params(efs, hosts=["10.0.0.8"], require_data=True))["added"] == ["10.0.0.8"]


@pytest.mark.parametrize("pattern", ["prepare_data_success", "../x_{ip}"])
def test_require_must_name_a_file_per_host_beside_host_worker(efs, pattern):
    with pytest.raises(host_worker.HostWorkerFailure, match="is not a file name with"):
        run(params(efs, hosts=["10.0.0.8"], require=pattern))


def test_remove_and_idempotence(efs):
    res = run(params(efs, hosts=["10.0.0.3"], state="absent"))
    assert res["changed"] is True
    assert res["removed"] == ["10.0.0.3"]
    assert res["hosts"] == ["10.0.0.2", MASTER]
    assert text(efs) == "# base workers\n10.0.0.2\n# master\n10.0.0.1\n"
    res = run(params(efs, hosts=["10.0.0.3", "10.0.0.9"], state="absent"))
    assert res["changed"] is False and res["removed"] == []


def test_new_file_with_master(tmp_path):
    p = params(tmp_path, hosts=[MASTER, "10.0.0.2"], master=MASTER)
    res = run(p)
    assert res["changed"] is True
    assert (tmp_path / "host_worker").read_text() == "10.0.0.2\n10.0.0.1\n"
    assert res["added"] == ["10.0.0.2", MASTER]
    assert stat.S_IMODE(os.stat(str(tmp_path / "host_worker")).st_mode) == 0o644
    assert run(p)["changed"] is False


def test_new_file_master_only(tmp_path):
    res = run(params(tmp_path, master=MASTER))
    assert res["changed"] is True and res["hosts"] == [MASTER]


def test_new_file_without_master_last_host_is_master(tmp_path):
    res = run(params(tmp_path, hosts=["10.0.0.2", MASTER]))
    assert res["hosts"] == ["10.0.0.2", MASTER] and res["master"] == MASTER


def test_absent_on_missing_file_does_not_create_it(tmp_path):
    res = run(params(tmp_path, hosts=["10.0.0.2"], state="absent", master=MASTER))
    assert res["changed"] is False
    assert not (tmp_path / "host_worker").exists()


def test_master_matches_file(efs):
    assert run(params(efs, hosts=["10.0.0.4"], master=MASTER))["changed"] is True


# --- check mode and diff ---------------------------------------------------------------


def test_check_mode_leaves_file_untouched(efs):
    before = text(efs)
    mtime = os.stat(str(efs / "host_worker")).st_mtime_ns
    res = run(params(efs, hosts=["10.0.0.4"], wait=True), check_mode=True, diff_mode=True)
    assert res["changed"] is True
    assert res["added"] == ["10.0.0.4"]
    assert res["hosts"] == ["10.0.0.2", "10.0.0.3", "10.0.0.4", MASTER]
    assert res["waited_s"] == 0.0
    assert text(efs) == before
    assert os.stat(str(efs / "host_worker")).st_mtime_ns == mtime
    assert not (efs / "host_worker.lock").exists()


def test_diff_before_after(efs):
    before = text(efs)
    res = run(params(efs, hosts=["10.0.0.2"], state="absent"), diff_mode=True)
    assert res["diff"]["before"] == before
    assert res["diff"]["after"] == "# base workers\n10.0.0.3\n# master\n10.0.0.1\n"
    assert res["diff"]["after"] == text(efs)
    assert res["diff"]["before_header"] == str(efs / "host_worker")


def test_diff_new_file(tmp_path):
    res = run(params(tmp_path, hosts=["10.0.0.2"], master=MASTER), check_mode=True, diff_mode=True)
    assert res["diff"]["before"] == ""
    assert res["diff"]["after"] == "10.0.0.2\n10.0.0.1\n"
    assert "absent" in res["diff"]["before_header"]
    assert not (tmp_path / "host_worker").exists()


def test_no_diff_key_without_diff_mode(efs):
    assert "diff" not in run(params(efs, hosts=["10.0.0.4"]))


# --- refusals: nothing changes -----------------------------------------------------------


def assert_fails(efs, match, **kw):
    before = text(efs) if (efs / "host_worker").exists() else None
    with pytest.raises(host_worker.HostWorkerFailure) as info:
        run(params(efs, **kw))
    assert info.match(match), info.value.msg
    after = text(efs) if (efs / "host_worker").exists() else None
    assert after == before
    assert info.value.result["changed"] is False
    return info.value


def test_refuse_remove_master(efs):
    err = assert_fails(efs, r"refusing to remove 10\.0\.0\.1 \(the master\)", hosts=["10.0.0.2", MASTER],
                       state="absent")
    assert "nothing was changed" in err.msg


def test_refuse_remove_master_given_as_option(tmp_path):
    (tmp_path / "host_worker").write_text("")
    assert_fails(tmp_path, "the master", hosts=[MASTER], state="absent", master=MASTER)


def test_refuse_remove_protected(efs):
    assert_fails(efs, r"refusing to remove 10\.0\.0\.2 \(protected\)", hosts=["10.0.0.2", "10.0.0.3"],
                 state="absent", protected=["10.0.0.2"])


def test_master_mismatch(efs):
    assert_fails(efs, "ends with 10.0.0.1.*master=10.0.0.9", hosts=["10.0.0.4"], master="10.0.0.9")


def test_replace_master_after_the_master_was_lost(efs):
    # bootstrap re-run after the master died: a new master, one more worker, the workers kept
    res = run(params(efs, hosts=["10.0.0.2", "10.0.0.4"], master="10.0.0.9", replace_master=True))
    assert res["changed"] is True
    assert res["added"] == ["10.0.0.9", "10.0.0.4"] and res["removed"] == ["10.0.0.1"]
    assert text(efs) == "# base workers\n10.0.0.2\n10.0.0.3\n# master\n10.0.0.4\n10.0.0.9\n"
    # idempotent: the same request again changes nothing
    again = run(params(efs, hosts=["10.0.0.2", "10.0.0.4"], master="10.0.0.9", replace_master=True))
    assert again["changed"] is False and text(efs).endswith("10.0.0.9\n")


def test_replace_master_that_was_a_worker(efs):
    res = run(params(efs, master="10.0.0.3", replace_master=True))
    assert res["removed"] == ["10.0.0.1"]
    assert text(efs) == "# base workers\n10.0.0.2\n# master\n10.0.0.3\n"


def test_replace_master_does_not_apply_to_removals(efs):
    assert_fails(efs, "ends with 10.0.0.1.*master=10.0.0.9", hosts=["10.0.0.2"], state="absent",
                 master="10.0.0.9", replace_master=True)


@pytest.mark.parametrize("field,value", [
    ("hosts", ["10.0.0.4", "10.0.0.300"]),
    ("hosts", ["worker-4"]),
    ("protected", ["nope"]),
    ("master", "10.0.0"),
])
def test_invalid_address(efs, field, value):
    err = assert_fails(efs, "invalid worker address", **{field: value})
    assert "nothing was changed" in err.msg


def test_malformed_file_names_line(efs):
    (efs / "host_worker").write_text("10.0.0.2\n10.0.0.3 extra\n10.0.0.1\n")
    assert_fails(efs, r"host_worker line 2 is malformed: '10\.0\.0\.3 extra'", hosts=["10.0.0.4"])


def test_malformed_file_in_check_mode(efs):
    (efs / "host_worker").write_text("10.0.0.2\n10.0.0.2\n")
    with pytest.raises(host_worker.HostWorkerFailure, match="line 2 repeats 10.0.0.2"):
        run(params(efs, hosts=["10.0.0.4"]), check_mode=True)


def test_missing_directory(tmp_path):
    p = params(tmp_path, hosts=["10.0.0.2"])
    p["path"] = str(tmp_path / "not-mounted" / "host_worker")
    with pytest.raises(host_worker.HostWorkerFailure, match="not-mounted of path does not exist"):
        run(p)
    assert not (tmp_path / "not-mounted").exists()


def test_path_is_directory(tmp_path):
    (tmp_path / "host_worker").mkdir()
    with pytest.raises(host_worker.HostWorkerFailure, match="is a directory"):
        run(params(tmp_path, hosts=["10.0.0.2"]))


# --- wait ---------------------------------------------------------------------------------


def test_wait_success_only_new_lines_count(efs):
    log = str(efs / "host_worker_log")
    # an old ADDED line for 10.0.0.4 (from an earlier membership) must not count
    with open(log, "a") as handle:
        handle.write("2 ADDED 10.0.0.4 3\n3 REMOVED 10.0.0.4 4\n")
    t = append_later(log, ["4 ADDED 10.0.0.5 5", "5 ADDED 10.0.0.4 6"], 0.3)
    res = run(params(efs, hosts=["10.0.0.4", "10.0.0.5"], wait=True, timeout=10))
    t.join()
    assert res["changed"] is True
    assert res["events"] == ["4 ADDED 10.0.0.5 5", "5 ADDED 10.0.0.4 6"]
    assert res["unconfirmed"] == []
    assert 0.2 <= res["waited_s"] < 5


def test_wait_remove_accepts_failed(efs):
    log = str(efs / "host_worker_log")
    t = append_later(log, ["2 REMOVED 10.0.0.2 3", "3 FAILED 10.0.0.3 4"], 0.2)
    res = run(params(efs, hosts=["10.0.0.2", "10.0.0.3"], state="absent", wait=True, timeout=10))
    t.join()
    assert res["events"] == ["2 REMOVED 10.0.0.2 3", "3 FAILED 10.0.0.3 4"]


def test_wait_nothing_to_change_returns_at_once(efs):
    start = time.time()
    res = run(params(efs, hosts=["10.0.0.2"], wait=True, timeout=30))
    assert time.time() - start < 1
    assert res["changed"] is False and res["waited_s"] == 0.0 and res["events"] == []


def test_wait_missing_log_then_created(efs):
    os.unlink(str(efs / "host_worker_log"))
    t = append_later(str(efs / "host_worker_log"), ["0 ADDED 10.0.0.4 9"], 0.2)
    res = run(params(efs, hosts=["10.0.0.4"], wait=True, timeout=10))
    t.join()
    assert res["events"] == ["0 ADDED 10.0.0.4 9"]


def test_wait_custom_log_path_and_warns_malformed(efs):
    log = str(efs / "custom_log")
    warnings = []
    t = append_later(log, ["not a log line", "0 ADDED 10.0.0.4 9"], 0.2)
    res = run(params(efs, hosts=["10.0.0.4"], wait=True, timeout=10, log_path=log), warn=warnings.append)
    t.join()
    assert res["events"] == ["0 ADDED 10.0.0.4 9"]
    assert len(warnings) == 1 and "not a log line" in warnings[0]


def test_wait_timeout_names_hosts_and_shows_tail(efs):
    (efs / "logs").mkdir()
    launcher = efs / "logs" / "launcher.log"
    launcher.write_text("".join("launcher line %d\n" % i for i in range(40)))
    log = str(efs / "host_worker_log")
    t = append_later(log, ["2 ADDED 10.0.0.5 3"], 0.1)
    with pytest.raises(host_worker.HostWorkerFailure) as info:
        run(params(efs, hosts=["10.0.0.4", "10.0.0.5", "10.0.0.6"], wait=True, timeout=0.6))
    t.join()
    err = info.value
    assert "timed out after 0.6 s" in err.msg
    assert "no ADDED line for 10.0.0.4, 10.0.0.6" in err.msg
    assert "(confirmed: 10.0.0.5)" in err.msg
    assert "stays in place" in err.msg
    assert "launcher is writing its log" in err.msg
    assert "last 20 lines of %s" % launcher in err.msg
    assert "launcher line 39" in err.msg and "launcher line 20" in err.msg
    assert "launcher line 19\n" not in err.msg
    assert err.result["changed"] is True
    assert err.result["unconfirmed"] == ["10.0.0.4", "10.0.0.6"]
    assert err.result["events"] == ["2 ADDED 10.0.0.5 3"]
    assert err.result["launcher_log_tail"][-1] == "launcher line 39"
    assert err.result["waited_s"] >= 0.5
    # the edit stays
    assert "10.0.0.6" in hwf.read_hosts(str(efs / "host_worker"))


def test_wait_timeout_launcher_not_running(efs):
    with pytest.raises(host_worker.HostWorkerFailure) as info:
        run(params(efs, hosts=["10.0.0.2"], state="absent", wait=True, timeout=0.2))
    msg = info.value.msg
    assert "no REMOVED/FAILED line for 10.0.0.2" in msg
    assert "no launcher log at %s" % (efs / "logs" / "launcher.log") in msg
    assert "appears not to be running" in msg


def test_wait_timeout_stale_launcher_log(efs):
    launcher = efs / "launcher.log"
    launcher.write_text("last words\n")
    old = time.time() - 3600
    os.utime(str(launcher), (old, old))
    os.unlink(str(efs / "host_worker_log"))
    with pytest.raises(host_worker.HostWorkerFailure) as info:
        run(params(efs, hosts=["10.0.0.4"], wait=True, timeout=0.2, launcher_log=str(launcher)))
    msg = info.value.msg
    assert "last written" in msg and "appears not to be running" in msg
    assert "never confirmed a change" in msg
    assert "last words" in msg


def test_wait_add_reported_failed(efs):
    t = append_later(str(efs / "host_worker_log"), ["2 FAILED 10.0.0.4 3"], 0.1)
    with pytest.raises(host_worker.HostWorkerFailure) as info:
        run(params(efs, hosts=["10.0.0.4"], wait=True, timeout=10))
    t.join()
    assert "reported a failure instead of ADDED for 10.0.0.4" in info.value.msg
    assert info.value.result["waited_s"] < 5


def test_wait_with_fake_clock():
    """wait_for_log honours the timeout without real sleeping."""
    now = [1000.0]

    def clock():
        return now[0]

    def sleep(s):
        now[0] += s

    events, unconfirmed, rejected, waited = host_worker.wait_for_log(
        "/nonexistent/host_worker_log", (0, -1), "present", ["10.0.0.4"], 300, sleep=sleep, clock=clock)
    assert (events, unconfirmed, rejected) == ([], ["10.0.0.4"], [])
    assert waited == 300


# --- the units of run: validation, edit computation, apply, confirmation, result -------------


def test_request_defaults_and_normalisation(efs):
    req = host_worker.Request.from_params(dict(path=str(efs / "sub" / ".." / "host_worker"),
                                               hosts=[" 10.0.0.4", "10.0.0.4", "10.0.0.5"],
                                               protected=["10.0.0.2"]))
    assert req.path == str(efs / "host_worker")
    assert req.directory == str(efs)
    assert req.log_path == str(efs / "host_worker_log")
    assert req.launcher_log == str(efs / "logs" / "launcher.log")
    assert req.state == "present" and req.wait is False and req.master is None
    assert req.hosts == ["10.0.0.4", "10.0.0.5"]
    assert req.protected == frozenset(["10.0.0.2"])
    assert (req.timeout, req.lock_timeout) == (300.0, 30.0)


def test_request_explicit_options(efs):
    req = host_worker.Request.from_params(params(efs, log_path="/x/log", launcher_log="/x/l.log", timeout=7,
                                                 lock_timeout=None, wait=True, master=MASTER, state="absent"))
    assert (req.log_path, req.launcher_log, req.state, req.wait, req.master) == (
        "/x/log", "/x/l.log", "absent", True, MASTER)
    assert (req.timeout, req.lock_timeout) == (7.0, 30.0)


def test_validate_fails_before_touching_anything(tmp_path):
    result = host_worker.empty_result()
    with pytest.raises(host_worker.HostWorkerFailure, match="invalid worker address.*nothing was changed") as info:
        host_worker.validate(dict(path=str(tmp_path / "nope" / "host_worker"), hosts=["x"]), result)
    assert info.value.result == result
    with pytest.raises(host_worker.HostWorkerFailure, match="nope of path does not exist"):
        host_worker.validate(dict(path=str(tmp_path / "nope" / "host_worker")), result)


def test_check_target(tmp_path):
    req = host_worker.Request.from_params(dict(path=str(tmp_path / "host_worker")))
    host_worker.check_target(req)
    (tmp_path / "host_worker").mkdir()
    with pytest.raises(hwf.HostWorkerError, match="is a directory"):
        host_worker.check_target(req)


@pytest.mark.parametrize("text,hosts,state,master,protected,expected", [
    # add before the master; present hosts are not added again
    ("10.0.0.2\n10.0.0.1\n", ["10.0.0.2", "10.0.0.3"], "present", None, set(),
     ("10.0.0.2\n10.0.0.3\n10.0.0.1\n", ["10.0.0.3"], [], ["10.0.0.2", "10.0.0.1"], "10.0.0.1")),
    # new file: the master goes last whatever the order of hosts
    (None, ["10.0.0.1", "10.0.0.2"], "present", "10.0.0.1", set(),
     ("10.0.0.2\n10.0.0.1\n", ["10.0.0.2", "10.0.0.1"], [], [], "10.0.0.1")),
    # nothing to do returns the text unchanged (None stays None)
    (None, ["10.0.0.2"], "absent", None, set(), (None, [], [], [], None)),
    ("10.0.0.2\n10.0.0.3\n10.0.0.1\n", ["10.0.0.3", "10.0.0.9"], "absent", None, {"10.0.0.2"},
     ("10.0.0.2\n10.0.0.1\n", [], ["10.0.0.3"], ["10.0.0.2", "10.0.0.3", "10.0.0.1"], "10.0.0.1")),
])
def test_plan(text, hosts, state, master, protected, expected):
    assert host_worker.plan(text, hosts, state, master, protected, "hw") == expected


def test_plan_refusals():
    with pytest.raises(hwf.HostWorkerError, match=r"10\.0\.0\.1 \(the master\), 10\.0\.0\.2 \(protected\) from hw"):
        host_worker.plan("10.0.0.2\n10.0.0.1\n", ["10.0.0.1", "10.0.0.2"], "absent", None, {"10.0.0.2"}, "hw")
    with pytest.raises(hwf.HostWorkerError, match="hw ends with 10.0.0.1.*master=10.0.0.9"):
        host_worker.plan("10.0.0.1\n", [], "present", "10.0.0.9", set(), "hw")


def test_apply_edit_check_mode_reads_only(efs):
    req = host_worker.Request.from_params(params(efs, hosts=["10.0.0.4"]))
    edit = host_worker.apply_edit(req, check_mode=True)
    assert edit.changed and edit.added == ["10.0.0.4"] and edit.position is None
    assert edit.before == text(efs) and "10.0.0.4" in edit.after
    assert "10.0.0.4" not in text(efs)
    assert not (efs / "host_worker.lock").exists()


def test_apply_edit_records_log_position_before_writing(efs):
    req = host_worker.Request.from_params(params(efs, hosts=["10.0.0.4"]))
    edit = host_worker.apply_edit(req)
    assert edit.position == (os.path.getsize(str(efs / "host_worker_log")), 1)
    assert text(efs) == edit.after
    again = host_worker.apply_edit(req)
    assert not again.changed and again.position is None and again.after == again.before


def test_edit_or_fail_wraps_os_errors(efs, monkeypatch):
    def broken(*_a, **_kw):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(host_worker, "atomic_write", broken)
    req = host_worker.Request.from_params(params(efs, hosts=["10.0.0.4"]))
    with pytest.raises(host_worker.HostWorkerFailure, match="cannot update .*Permission denied; nothing was"):
        host_worker.edit_or_fail(req, False, host_worker.empty_result())


def test_confirmations_present():
    conf = host_worker.Confirmations("present", ["10.0.0.4", "10.0.0.5"], last_seq=3)
    conf.take([(3, "ADDED", "10.0.0.4", 1, "3 ADDED 10.0.0.4 1"),      # before the edit
               (4, "ADDED", "10.0.0.9", 2, "4 ADDED 10.0.0.9 2"),      # not ours
               (5, "ADDED", "10.0.0.4", 3, "5 ADDED 10.0.0.4 3")])
    assert conf.events == ["5 ADDED 10.0.0.4 3"] and conf.pending == ["10.0.0.5"] and not conf.settled
    conf.take([(6, "FAILED", "10.0.0.5", 4, "6 FAILED 10.0.0.5 4")])
    assert conf.rejected == ["6 FAILED 10.0.0.5 4"] and conf.pending == [] and conf.settled


def test_confirmations_absent():
    conf = host_worker.Confirmations("absent", ["10.0.0.2", "10.0.0.3"], last_seq=-1)
    conf.take([(0, "ADDED", "10.0.0.2", 1, "0 ADDED 10.0.0.2 1"),
               (1, "FAILED", "10.0.0.3", 2, "1 FAILED 10.0.0.3 2")])
    assert conf.events == ["1 FAILED 10.0.0.3 2"] and conf.pending == ["10.0.0.2"] and not conf.settled
    conf.take([(2, "REMOVED", "10.0.0.2", 3, "2 REMOVED 10.0.0.2 3")])
    assert conf.settled and conf.rejected == []


def test_malformed_line_warner_warns_once():
    warnings = []
    warner = host_worker.MalformedLineWarner("/efs/log", warnings.append)
    warner(["junk", "junk"])
    warner(["junk", "more"])
    assert warnings == ["ignoring malformed /efs/log line 'junk'", "ignoring malformed /efs/log line 'more'"]
    host_worker.MalformedLineWarner("/efs/log", None)(["junk"])


def test_edit_result_and_diff(efs):
    req = host_worker.Request.from_params(params(efs))
    edit = host_worker.Edit(before=None, after="10.0.0.2\n10.0.0.1\n", added=["10.0.0.2", MASTER], removed=[])
    res = host_worker.edit_result(req, edit)
    assert res == dict(changed=True, hosts=["10.0.0.2", MASTER], master=MASTER, added=["10.0.0.2", MASTER],
                       removed=[])
    diff = host_worker.edit_result(req, edit, diff_mode=True)["diff"]
    assert diff == dict(before="", after="10.0.0.2\n10.0.0.1\n", before_header=req.path + " (absent)",
                        after_header=req.path)
    empty = host_worker.edit_result(req, host_worker.Edit(before=None, after=None, added=[], removed=[]))
    assert empty["hosts"] == [] and empty["master"] is None and empty["changed"] is False


def test_describe_tail():
    assert host_worker.describe_tail("/l", None) == "(no launcher log at /l)"
    assert host_worker.describe_tail("/l", []) == "(launcher log /l is empty)"
    assert host_worker.describe_tail("/l", ["a", "b"]) == "last 2 lines of /l:\na\nb"


def test_tail_file(tmp_path):
    log = tmp_path / "launcher.log"
    assert host_worker.tail_file(str(log)) is None
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert host_worker.tail_file(str(log), lines=3) == ["line 97", "line 98", "line 99"]
    # a partial first line beyond max_bytes is dropped
    assert host_worker.tail_file(str(log), lines=100, max_bytes=20) == ["line 98", "line 99"]


def test_wait_failure_rejected_message(efs):
    req = host_worker.Request.from_params(params(efs, hosts=["10.0.0.4"]))
    result = dict(host_worker.empty_result(), hosts=["10.0.0.2", "10.0.0.4", MASTER])
    err = host_worker.wait_failure(req, result, ["10.0.0.4"], ["2 FAILED 10.0.0.4 3"])
    assert err.msg.startswith("the launcher reported a failure instead of ADDED for 10.0.0.4: 2 FAILED 10.0.0.4 3. ")
    assert "now lists 10.0.0.2, 10.0.0.4, 10.0.0.1" in err.msg
    assert err.msg.endswith(f"(no launcher log at {efs / 'logs' / 'launcher.log'})")
    assert err.result["launcher_log_tail"] == []


# --- concurrency ----------------------------------------------------------------------------


def _add_one(path, ip):
    host_worker.run(dict(path=path, hosts=[ip], state="present", lock_timeout=60))


def test_concurrent_writers_do_not_lose_updates(efs):
    path = str(efs / "host_worker")
    ips = ["10.0.1.%d" % i for i in range(1, 25)]
    # spawn, never fork: pytest has threads by now (moto's server), and a forked child can inherit a
    # lock one of them held and hang for ever (it did, in CI)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_add_one, args=(path, ip)) for ip in ips]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    hosts = hwf.read_hosts(path)
    assert sorted(hosts[:-1]) == sorted(["10.0.0.2", "10.0.0.3"] + ips)
    assert hosts[-1] == MASTER


def test_concurrent_threads_add_and_remove(efs):
    path = str(efs / "host_worker")
    errors = []

    def worker(i):
        try:
            ip = "10.0.2.%d" % i
            host_worker.run(dict(path=path, hosts=[ip], lock_timeout=60))
            if i % 2:
                host_worker.run(dict(path=path, hosts=[ip], state="absent", lock_timeout=60))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(1, 21)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    hosts = hwf.read_hosts(path)
    assert sorted(hosts[2:-1]) == sorted("10.0.2.%d" % i for i in range(2, 21, 2))
    assert hosts[-1] == MASTER


def test_lock_held_elsewhere_fails_cleanly(efs):
    before = text(efs)
    with hwf.locked(str(efs / "host_worker")):
        with pytest.raises(host_worker.HostWorkerFailure, match="could not lock"):
            run(params(efs, hosts=["10.0.0.4"], lock_timeout=0.2))
    assert text(efs) == before


# --- through AnsibleModule --------------------------------------------------------------------


def run_module(args, capsys):
    with patch_module_args(args):
        with pytest.raises(SystemExit) as info:
            host_worker.main()
    out = json.loads(capsys.readouterr().out)
    return info.value.code, out


def test_main_apply_and_check(efs, capsys):
    args = dict(path=str(efs / "host_worker"), hosts=["10.0.0.4"], _ansible_check_mode=True, _ansible_diff=True)
    code, out = run_module(args, capsys)
    assert code == 0 and out["changed"] is True and "10.0.0.4" not in text(efs)
    assert "10.0.0.4" in out["diff"]["after"]
    args.pop("_ansible_check_mode")
    code, out = run_module(args, capsys)
    assert code == 0 and out["changed"] is True and "10.0.0.4" in text(efs)
    code, out = run_module(args, capsys)
    assert code == 0 and out["changed"] is False
    assert out["hosts"] == ["10.0.0.2", "10.0.0.3", "10.0.0.4", MASTER]


def test_main_failure(efs, capsys):
    code, out = run_module(dict(path=str(efs / "host_worker"), hosts=[MASTER], state="absent"), capsys)
    assert code == 1 and out["failed"] is True
    assert "the master" in out["msg"] and out["changed"] is False


def test_main_rejects_bad_state(efs, capsys):
    code, out = run_module(dict(path=str(efs / "host_worker"), state="gone"), capsys)
    assert code == 1 and "state" in out["msg"]


# --- short polls: edit, then confirm with poll (the playbooks' until/retries loop) ---------------


def test_edit_returns_confirm_for_a_later_wait(efs):
    res = run(params(efs, hosts=["10.0.0.4"]))
    confirm = res["confirm"]
    assert confirm["state"] == "present" and confirm["pending"] == ["10.0.0.4"]
    # the log held two lines (36 bytes) before the edit: only later lines may confirm
    assert confirm["position"] == [len("0 ADDED 10.0.0.2 1\n1 ADDED 10.0.0.3 2\n"), 1]
    assert abs(confirm["started"] - time.time()) < 5
    assert res["settled"] is True


def test_edit_without_change_has_nothing_pending(efs):
    res = run(params(efs, hosts=["10.0.0.2"]))
    assert res["confirm"]["pending"] == []
    again = run(params(efs, confirm=res["confirm"], poll=5, timeout=30))
    assert again["settled"] is True and again["events"] == []


def test_poll_reports_progress_then_settles(efs):
    log = efs / "host_worker_log"
    edit = run(params(efs, hosts=["10.0.0.4", "10.0.0.5"]))
    with open(log, "a") as handle:
        handle.write("2 ADDED 10.0.0.5 3\n")
    first = run(params(efs, confirm=edit["confirm"], poll=0.1, timeout=60))
    assert first["settled"] is False and first["changed"] is False
    assert first["confirmed"] == ["10.0.0.5"] and first["pending"] == ["10.0.0.4"]
    assert 50 < first["seconds_left"] <= 60
    assert first["msg"].startswith("waiting for the launcher to confirm ADDED: confirmed [10.0.0.5], "
                                   "pending [10.0.0.4], ")
    assert first["msg"].endswith(" s left")
    # the call only waits: the file is unchanged by it
    assert first["hosts"] == ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", MASTER]
    with open(log, "a") as handle:
        handle.write("3 ADDED 10.0.0.4 4\n")
    second = run(params(efs, confirm=edit["confirm"], poll=5, timeout=60))
    assert second["settled"] is True and second["pending"] == []
    assert second["events"] == ["2 ADDED 10.0.0.5 3", "3 ADDED 10.0.0.4 4"]
    assert second["confirmed"] == ["10.0.0.4", "10.0.0.5"]
    assert "confirmed ADDED for 10.0.0.4, 10.0.0.5" in second["msg"]


def test_poll_timeout_counts_from_the_edit_and_fails_clearly(efs):
    edit = run(params(efs, hosts=["10.0.0.3"], state="absent"))
    confirm = dict(edit["confirm"], started=time.time() - 100)
    with pytest.raises(host_worker.HostWorkerFailure) as info:
        run(params(efs, confirm=confirm, poll=10, timeout=90))
    err = info.value
    assert "timed out after 90 s" in err.msg
    # the state of the edit, not the (default) state option of the waiting call
    assert "no REMOVED/FAILED line for 10.0.0.3" in err.msg
    assert err.result["unconfirmed"] == ["10.0.0.3"] and err.result["seconds_left"] == 0.0
    assert err.result["waited_s"] >= 100


def test_poll_fails_at_once_when_the_launcher_rejects(efs):
    edit = run(params(efs, hosts=["10.0.0.4"]))
    with open(efs / "host_worker_log", "a") as handle:
        handle.write("2 FAILED 10.0.0.4 3\n")
    with pytest.raises(host_worker.HostWorkerFailure) as info:
        run(params(efs, confirm=edit["confirm"], poll=10, timeout=600))
    assert "reported a failure instead of ADDED for 10.0.0.4" in info.value.msg


def test_a_host_the_launcher_rejects_is_not_confirmed(efs):
    """join_workers tags ADDED only the hosts in confirmed (issue 24, defect 4)."""
    edit = run(params(efs, hosts=["10.0.0.4", "10.0.0.5"]))
    with open(efs / "host_worker_log", "a") as handle:
        handle.write("2 ADDED 10.0.0.5 3\n3 FAILED 10.0.0.4 4\n")
    with pytest.raises(host_worker.HostWorkerFailure) as info:
        run(params(efs, confirm=edit["confirm"], poll=10, timeout=600))
    assert info.value.result["confirmed"] == ["10.0.0.5"]
    assert info.value.result["events"] == ["2 ADDED 10.0.0.5 3"]


def test_poll_with_fake_clock_returns_after_poll_seconds(efs):
    now = [1000.0]

    def sleep(s):
        now[0] += s

    confirm = dict(state="present", pending=["10.0.0.4"], position=[0, 1], started=990.0)
    res = run(params(efs, confirm=confirm, poll=10, timeout=300), sleep=sleep, clock=lambda: now[0])
    assert now[0] == 1010.0
    assert res["settled"] is False and res["seconds_left"] == 280.0 and res["waited_s"] == 20.0


@pytest.mark.parametrize("confirm", [{}, {"state": "present", "pending": ["x"], "position": [0, 1], "started": 1},
                                     {"state": "gone", "pending": [], "position": [0, 1], "started": 1}])
def test_invalid_confirm_fails_before_anything(efs, confirm):
    with pytest.raises(host_worker.HostWorkerFailure) as info:
        run(params(efs, confirm=confirm))
    assert "confirm" in info.value.msg or "invalid" in info.value.msg


def test_main_poll_progress_and_timeout(efs, capsys):
    """Through AnsibleModule: an unsettled poll exits ok with its msg; a timeout fails with the timeout msg."""
    edit = run(params(efs, hosts=["10.0.0.4"]))
    code, out = run_module(dict(path=str(efs / "host_worker"), confirm=edit["confirm"], poll=0.1), capsys)
    assert code == 0 and out["settled"] is False and out["pending"] == ["10.0.0.4"]
    assert out["msg"].startswith("waiting for the launcher to confirm ADDED")
    late = dict(edit["confirm"], started=time.time() - 10)
    code, out = run_module(dict(path=str(efs / "host_worker"), confirm=late, poll=1, timeout=1), capsys)
    assert code == 1 and out["failed"] is True and out["msg"].startswith("timed out after 1 s")
