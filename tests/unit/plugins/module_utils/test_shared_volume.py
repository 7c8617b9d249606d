"""Unit tests for plugins/module_utils/shared_volume.py (the host_worker formats)."""
import ast
import os
import stat
import sys

import pytest

from ansible_collections.dynatrain.elastic.plugins.module_utils import shared_volume as hwf

MODULE_FILE = hwf.__file__


def test_stdlib_only():
    """The file is shipped to nodes as dynatrain_runtime.contract.shared_volume: nothing but the standard library."""
    tree = ast.parse(open(MODULE_FILE).read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    names.discard("__future__")
    stdlib = getattr(sys, "stdlib_module_names", None)
    assert names, names
    for name in names:
        assert name != "ansible" and name != "ansible_collections", name
        if stdlib is not None:
            assert name in stdlib, name


@pytest.mark.parametrize("value,expected", [
    ("10.0.0.1", "10.0.0.1"),
    (" 10.0.0.1 ", "10.0.0.1"),
    ("127.77.1.5", "127.77.1.5"),
])
def test_validate_ip_ok(value, expected):
    assert hwf.validate_ip(value) == expected


@pytest.mark.parametrize("value", ["", "10.0.0", "10.0.0.256", "host.example", "::1", "10.0.0.1/24", "10.0.0.01"])
def test_validate_ip_bad(value):
    with pytest.raises(hwf.HostWorkerError, match="invalid worker address"):
        hwf.validate_ip(value)


def test_parse_comments_blank_and_inline():
    text = "# workers\n\n10.0.0.2  # elastic\n  10.0.0.3\n# master last\n10.0.0.1\n"
    assert hwf.parse_hosts(text) == ["10.0.0.2", "10.0.0.3", "10.0.0.1"]


def test_parse_empty_and_no_trailing_newline():
    assert hwf.parse_hosts("") == []
    assert hwf.parse_hosts("# nothing\n\n") == []
    assert hwf.parse_hosts("10.0.0.2\n10.0.0.1") == ["10.0.0.2", "10.0.0.1"]
    assert hwf.parse_hosts("10.0.0.2\r\n10.0.0.1\r\n") == ["10.0.0.2", "10.0.0.1"]


def test_parse_malformed_names_line():
    with pytest.raises(hwf.HostWorkerError, match=r"/efs/host_worker line 3 is malformed: 'worker-3'"):
        hwf.parse_hosts("10.0.0.2\n\nworker-3\n10.0.0.1\n", source="/efs/host_worker")


def test_parse_two_addresses_on_a_line_is_malformed():
    with pytest.raises(hwf.HostWorkerError, match="line 1 is malformed"):
        hwf.parse_hosts("10.0.0.2 10.0.0.3\n")


def test_parse_duplicate_rejected():
    with pytest.raises(hwf.HostWorkerError, match="line 3 repeats 10.0.0.2"):
        hwf.parse_hosts("10.0.0.2\n10.0.0.3\n10.0.0.2\n")


def test_render_master_last():
    assert hwf.render_hosts(["10.0.0.1", "10.0.0.2"], master="10.0.0.1") == "10.0.0.2\n10.0.0.1\n"
    assert hwf.render_hosts([]) == ""


def test_edit_insert_before_master_keeps_comments():
    text = "# base\n10.0.0.2\n\n# master\n10.0.0.1  # do not remove\n"
    out = hwf.edit_hosts_text(text, add=["10.0.0.3", "10.0.0.4"])
    assert out == "# base\n10.0.0.2\n\n# master\n10.0.0.3\n10.0.0.4\n10.0.0.1  # do not remove\n"
    assert hwf.parse_hosts(out)[-1] == "10.0.0.1"


def test_edit_add_existing_is_noop_and_dedupes():
    text = "10.0.0.2\n10.0.0.1\n"
    assert hwf.edit_hosts_text(text, add=["10.0.0.2", "10.0.0.3", "10.0.0.3"]) == "10.0.0.2\n10.0.0.3\n10.0.0.1\n"
    assert hwf.edit_hosts_text(text, add=["10.0.0.1"]) == text


def test_edit_remove_drops_line_with_comment():
    text = "10.0.0.2 # elastic\n10.0.0.3\n10.0.0.1\n"
    assert hwf.edit_hosts_text(text, remove=["10.0.0.2"]) == "10.0.0.3\n10.0.0.1\n"
    assert hwf.edit_hosts_text(text, remove=["10.9.9.9"]) == text


def test_edit_empty_file_master_last():
    assert hwf.edit_hosts_text("", add=["10.0.0.1", "10.0.0.2"], master="10.0.0.1") == "10.0.0.2\n10.0.0.1\n"
    assert hwf.edit_hosts_text("", add=["10.0.0.1"], master="10.0.0.1") == "10.0.0.1\n"
    # without a master, the last added address becomes the master
    assert hwf.edit_hosts_text("# new\n", add=["10.0.0.2", "10.0.0.1"]) == "# new\n10.0.0.2\n10.0.0.1\n"
    # removing from nothing writes nothing, not even the master
    assert hwf.edit_hosts_text("", remove=["10.0.0.2"], master="10.0.0.1") == ""


def test_edit_adds_trailing_newline():
    assert hwf.edit_hosts_text("10.0.0.1", add=["10.0.0.2"]) == "10.0.0.2\n10.0.0.1\n"


def test_edit_master_mismatch_refused():
    with pytest.raises(hwf.HostWorkerError, match="ends with 10.0.0.1, not with the master 10.0.0.9"):
        hwf.edit_hosts_text("10.0.0.2\n10.0.0.1\n", add=["10.0.0.3"], master="10.0.0.9")


def test_edit_invalid_address():
    with pytest.raises(hwf.HostWorkerError, match="invalid worker address"):
        hwf.edit_hosts_text("10.0.0.1\n", add=["10.0.0.x"])


def test_atomic_write_preserves_mode(tmp_path):
    path = str(tmp_path / "host_worker")
    hwf.atomic_write(path, "10.0.0.1\n")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    os.chmod(path, 0o664)
    hwf.atomic_write(path, "10.0.0.2\n10.0.0.1\n")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o664
    assert open(path).read() == "10.0.0.2\n10.0.0.1\n"
    hwf.atomic_write(path, "10.0.0.1\n", mode=0o600)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    # no temp files left behind
    assert sorted(os.listdir(str(tmp_path))) == ["host_worker"]


def test_atomic_write_replaces_inode(tmp_path):
    path = str(tmp_path / "host_worker")
    hwf.atomic_write(path, "10.0.0.1\n")
    reader = open(path)
    hwf.atomic_write(path, "10.0.0.2\n10.0.0.1\n")
    # an open reader keeps the complete old version (rename, not rewrite in place)
    assert reader.read() == "10.0.0.1\n"
    reader.close()


def test_atomic_write_missing_dir(tmp_path):
    with pytest.raises(hwf.HostWorkerError, match="does not exist"):
        hwf.atomic_write(str(tmp_path / "nope" / "host_worker"), "10.0.0.1\n")


def test_read_hosts_missing_is_empty(tmp_path):
    assert hwf.read_hosts(str(tmp_path / "host_worker")) == []


def test_lock_is_exclusive_and_times_out(tmp_path):
    path = str(tmp_path / "host_worker")
    with hwf.locked(path):
        assert os.path.exists(path + ".lock")
        with pytest.raises(hwf.HostWorkerError, match="could not lock"):
            with hwf.locked(path, timeout=0.2):
                pass
    with hwf.locked(path, timeout=0.2):
        pass


def test_log_format_roundtrip():
    line = hwf.format_log_line(0, "ADDED", "172.31.65.62", 1542536656974259605)
    assert line == "0 ADDED 172.31.65.62 1542536656974259605"
    assert hwf.parse_log_line(line) == (0, "ADDED", "172.31.65.62", 1542536656974259605)


@pytest.mark.parametrize("line", [
    "0 ADDED 172.31.65.62",
    "0 JOINED 172.31.65.62 1",
    "x ADDED 172.31.65.62 1",
    "0 ADDED 172.31.65 1",
])
def test_log_malformed(line):
    with pytest.raises(hwf.HostWorkerError):
        hwf.parse_log_line(line)


def test_append_log_continues_seq(tmp_path):
    log = str(tmp_path / "host_worker_log")
    assert hwf.append_log(log, "ADDED", "10.0.0.2", ns=5) == "0 ADDED 10.0.0.2 5"
    assert hwf.append_log(log, "REMOVED", "10.0.0.2", ns=6) == "1 REMOVED 10.0.0.2 6"
    assert [e[0] for e in hwf.read_log(log)] == [0, 1]


def test_read_log_since_partial_line_and_offsets(tmp_path):
    log = str(tmp_path / "host_worker_log")
    assert hwf.read_log_since(log) == ([], 0, [])
    assert hwf.log_position(log) == (0, -1)
    with open(log, "w") as handle:
        handle.write("0 ADDED 10.0.0.2 5\n1 ADDED 10.0.0.3 6\n2 ADD")
    entries, offset, bad = hwf.read_log_since(log)
    assert [e[:3] for e in entries] == [(0, "ADDED", "10.0.0.2"), (1, "ADDED", "10.0.0.3")]
    assert entries[1][4] == "1 ADDED 10.0.0.3 6"
    assert bad == []
    assert hwf.log_position(log) == (offset, 1)
    # the partial line is not consumed until it is complete
    assert hwf.read_log_since(log, offset) == ([], offset, [])
    with open(log, "a") as handle:
        handle.write("ED 10.0.0.4 7\ngarbage\n")
    entries, offset2, bad = hwf.read_log_since(log, offset)
    assert [e[4] for e in entries] == ["2 ADDED 10.0.0.4 7"]
    assert bad == ["garbage"]
    assert offset2 == os.path.getsize(log)


def test_read_log_since_file_replaced(tmp_path):
    log = str(tmp_path / "host_worker_log")
    with open(log, "w") as handle:
        handle.write("0 ADDED 10.0.0.2 5\n")
    entries, _offset, _bad = hwf.read_log_since(log, 10000)
    assert [e[0] for e in entries] == [0]


# --- atomic_write: str and bytes, mode/owner, cleanup, directory fsync ----------------------


def test_atomic_write_bytes(tmp_path):
    path = str(tmp_path / "weights.bin")
    payload = bytes(range(256)) + b"\r\n\x00"
    hwf.atomic_write(path, payload)
    with open(path, "rb") as handle:
        assert handle.read() == payload
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    hwf.atomic_write(path, bytearray(b"second"))
    with open(path, "rb") as handle:
        assert handle.read() == b"second"
    assert sorted(os.listdir(str(tmp_path))) == ["weights.bin"]


def test_atomic_write_bytes_keeps_mode_of_existing_file(tmp_path):
    path = str(tmp_path / "status.json")
    hwf.atomic_write(path, b"{}\n")
    os.chmod(path, 0o600)
    hwf.atomic_write(path, b'{"a": 1}\n')
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    hwf.atomic_write(path, b"{}\n", mode=0o640)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640


def test_atomic_write_str_is_utf8_and_newlines_untranslated(tmp_path):
    path = str(tmp_path / "notes")
    hwf.atomic_write(path, "caf\u00e9\r\nline\n")
    with open(path, "rb") as handle:
        assert handle.read() == "caf\u00e9\r\nline\n".encode("utf-8")


@pytest.mark.parametrize("content", [None, 42, ["10.0.0.1\n"]])
def test_atomic_write_rejects_other_content(tmp_path, content):
    path = str(tmp_path / "host_worker")
    with pytest.raises(TypeError, match="str or bytes"):
        hwf.atomic_write(path, content)
    assert os.listdir(str(tmp_path)) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
def test_atomic_write_keeps_owner(tmp_path):
    path = str(tmp_path / "host_worker")
    hwf.atomic_write(path, "10.0.0.1\n")
    os.chown(path, 4321, 4322)
    hwf.atomic_write(path, b"10.0.0.2\n10.0.0.1\n")
    st = os.stat(path)
    assert (st.st_uid, st.st_gid) == (4321, 4322)


def test_atomic_write_failed_rename_leaves_old_file_and_no_temp(tmp_path, monkeypatch):
    path = str(tmp_path / "host_worker")
    hwf.atomic_write(path, "10.0.0.1\n")

    def broken_rename(src, dst, **_dir_fds):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hwf.os, "rename", broken_rename)
    with pytest.raises(OSError, match="No space left"):
        hwf.atomic_write(path, b"10.0.0.2\n10.0.0.1\n")
    assert open(path).read() == "10.0.0.1\n"
    assert sorted(os.listdir(str(tmp_path))) == ["host_worker"]


def test_atomic_write_fsyncs_file_then_directory(tmp_path, monkeypatch):
    path = str(tmp_path / "host_worker")
    calls = []
    real_fsync = os.fsync

    def fsync(fd):
        st = os.fstat(fd)
        calls.append((stat.S_ISDIR(st.st_mode), os.path.exists(path)))
        real_fsync(fd)

    monkeypatch.setattr(hwf.os, "fsync", fsync)
    hwf.atomic_write(path, b"10.0.0.1\n")
    # the temp file before the rename, then the directory after it
    assert calls == [(False, False), (True, True)]


def test_fsync_directory_tolerates_missing_and_unsupported(tmp_path, monkeypatch):
    hwf.fsync_directory(str(tmp_path / "nope"))

    def unsupported(fd):
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(hwf.os, "fsync", unsupported)
    hwf.fsync_directory(str(tmp_path))


def test_existing_mode_owner(tmp_path):
    path = tmp_path / "f"
    assert hwf._existing_mode_owner(str(path)) == (0o644, None)
    path.write_text("x")
    os.chmod(str(path), 0o604)
    st = os.stat(str(path))
    assert hwf._existing_mode_owner(str(path)) == (0o604, (st.st_uid, st.st_gid))


# --- helpers of edit_hosts_text, locked, read_log_since ---------------------------------------


def test_first_addresses():
    assert hwf._first_addresses(["10.0.0.2", "10.0.0.1"], "10.0.0.1") == ["10.0.0.2", "10.0.0.1"]
    assert hwf._first_addresses(["10.0.0.2"], None) == ["10.0.0.2"]
    assert hwf._first_addresses([], "10.0.0.1") == []


def test_insert_before_master():
    scanned = [("# c", None), ("10.0.0.2", "10.0.0.2"), ("10.0.0.1", "10.0.0.1")]
    lines = [raw for raw, _ip in scanned]
    hwf._insert_before_master(lines, scanned, 2, ["10.0.0.3", "10.0.0.1"], "10.0.0.1", "hw")
    assert lines == ["# c", "10.0.0.2", "10.0.0.3", "10.0.0.1"]
    with pytest.raises(hwf.HostWorkerError, match="hw ends with 10.0.0.1, not with the master 10.0.0.9"):
        hwf._insert_before_master(list(lines), scanned, 2, [], "10.0.0.9", "hw")


def test_try_flock(tmp_path):
    path = str(tmp_path / "host_worker")
    fd = os.open(hwf.lock_path_for(path), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with hwf.locked(path):
            assert hwf._try_flock(fd) is False
        assert hwf._try_flock(fd) is True
    finally:
        os.close(fd)


def test_parse_log_lines():
    entries, bad = hwf._parse_log_lines(["0 ADDED 10.0.0.2 5", "", "  ", "junk", "1 FAILED 10.0.0.3 6 "])
    assert entries == [(0, "ADDED", "10.0.0.2", 5, "0 ADDED 10.0.0.2 5"),
                       (1, "FAILED", "10.0.0.3", 6, "1 FAILED 10.0.0.3 6")]
    assert bad == ["junk"]


def test_read_from_restarts_when_file_shrank(tmp_path):
    log = tmp_path / "host_worker_log"
    log.write_bytes(b"0123456789")
    assert hwf._read_from(str(log), 4) == (b"456789", 4)
    assert hwf._read_from(str(log), 11) == (b"0123456789", 0)


# --- host_worker_log as a write-ahead log (issue 24, defect 1) --------------------------------
def test_append_cuts_a_torn_last_line_and_continues_after_the_last_good_seq(tmp_path):
    log = tmp_path / "host_worker_log"
    log.write_text("0 ADDED 10.0.0.2 5\n1 ADDED 10.0.0.1 6\n2 ADDED 10.0.0.3 7\n3 REMOV")   # writer killed mid-append
    heard = []
    line = hwf.append_log(str(log), "REMOVED", "10.0.0.3", ns=8, warn=lambda kind, lines: heard.append((kind, lines)))
    assert line == "3 REMOVED 10.0.0.3 8"
    assert log.read_text().endswith("2 ADDED 10.0.0.3 7\n3 REMOVED 10.0.0.3 8\n")
    assert heard == [("torn", ["3 REMOV"])]
    assert [e[0] for e in hwf.read_log(str(log))] == [0, 1, 2, 3]          # strict reading is happy again


def test_append_skips_a_malformed_line_and_reports_it(tmp_path):
    log = tmp_path / "host_worker_log"
    log.write_text("0 ADDED 10.0.0.2 5\n1 ADDED not-an-ip 6\n1 ADDED 10.0.0.1 6\n")
    heard = []
    assert hwf.append_log(str(log), "ADDED", "10.0.0.3", ns=9,
                          warn=lambda kind, lines: heard.append((kind, lines))) == "2 ADDED 10.0.0.3 9"
    assert heard == [("malformed", ["1 ADDED not-an-ip 6"])]
    assert "1 ADDED not-an-ip 6\n" in log.read_text()                     # reported, left for a person


def test_scan_log_is_lenient(tmp_path):
    log = tmp_path / "host_worker_log"
    assert hwf.scan_log(str(log)) == ([], [], "")
    log.write_text("0 ADDED 10.0.0.2 5\njunk\n1 FAILED 10.0.0.2 6\n2 ADD")
    assert hwf.scan_log(str(log)) == ([(0, "ADDED", "10.0.0.2", 5), (1, "FAILED", "10.0.0.2", 6)], ["junk"], "2 ADD")


def test_lock_deadline_ignores_wall_clock_steps(tmp_path, monkeypatch):
    import time as _time
    path = str(tmp_path / "host_worker")
    real = _time.time
    with hwf.locked(path):
        fd = os.open(path + ".lock", os.O_RDWR)
        try:
            assert hwf._try_flock(fd) is False
        finally:
            os.close(fd)
        steps = iter([0.0] + [3600.0] * 1000)
        monkeypatch.setattr(_time, "time", lambda: real() + next(steps))    # the clock jumps an hour ahead
        t0 = _time.monotonic()
        with pytest.raises(hwf.HostWorkerError, match="could not lock"):
            with hwf.locked(path, timeout=0.3):
                pass
        assert _time.monotonic() - t0 >= 0.25                              # waited its 0.3 s, not 0
