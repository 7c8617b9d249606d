"""Unit tests for the dynatrain.elastic.progress stdout callback: real Task/Host/result objects, a fake clock."""
import os

import pytest

from ansible.executor.task_result import CallbackTaskResult
from ansible.inventory.host import Host
from ansible.playbook.play import Play
from ansible.playbook.task import Task
from ansible.plugins.loader import callback_loader

from ansible_collections.dynatrain.elastic.plugins.callback import progress


class Screen:
    """Stands in for the terminal's Display: records the compact lines."""

    verbosity = 0
    columns = 80

    def __init__(self):
        self.lines = []

    def display(self, msg, **_kw):
        self.lines.append(msg)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture
def cb(tmp_path):
    screen, clock = Screen(), Clock()
    # loaded the way Ansible loads it, so that its documented options (and the default callback's) apply
    callback_loader.add_directory(os.path.dirname(progress.__file__))
    plugin = callback_loader.get("progress", display=screen, clock=clock)
    plugin.set_options(direct={"log_file": str(tmp_path / "full.log"), "slow_after": 0})
    plugin.screen, plugin.clock, plugin.logfile = screen, clock, tmp_path / "full.log"
    plugin.v2_playbook_on_play_start(Play.load(dict(name="Join the workers", hosts="all")))
    screen.lines.clear()
    return plugin


def task(name, **args):
    return Task.load(dict(name=name, **(args or {"debug": {"msg": "x"}})))


def result(host, tsk, **data):
    return CallbackTaskResult(Host(host), tsk, data, tsk.dump_attrs())


def test_task_line_counts_hosts_and_skips_all_skipped_tasks(cb):
    cb.v2_playbook_on_play_start(Play.load(dict(name="Join the workers", hosts="all")))
    t1 = task("Configure")
    cb.v2_playbook_on_task_start(t1, False)
    cb.v2_runner_on_ok(result("10.0.0.2", t1, changed=True))
    cb.v2_runner_on_ok(result("10.0.0.3", t1, changed=False))
    cb.clock.now += 3.25
    t2 = task("Only on spot")
    cb.v2_playbook_on_task_start(t2, False)
    cb.v2_runner_on_skipped(result("10.0.0.2", t2, skipped=True))
    t3 = task("Last")
    cb.v2_playbook_on_task_start(t3, False)
    cb.v2_runner_on_ok(result("10.0.0.2", t3))
    assert cb.screen.lines == [
        "-- play: Join the workers",
        "  done      3.2 s  Configure  [2 hosts: 2 ok, 1 changed]",
    ]
    cb.v2_playbook_on_play_start(Play.load(dict(name="Record", hosts="localhost")))
    assert cb.screen.lines[-2:] == ["  done      0.0 s  Last  [1 host: 1 ok]", "-- play: Record"]


def test_failure_prints_host_and_first_line_of_msg(cb):
    t = task("Wait for the launcher's ADDED")
    cb.v2_playbook_on_task_start(t, False)
    cb.v2_runner_on_failed(result("10.0.0.1", t, failed=True,
                                  msg="timed out after 600 s waiting for the launcher\nlauncher log tail"))
    cb.v2_playbook_on_task_start(task("Next"), False)
    assert cb.screen.lines == [
        "  FAILED 10.0.0.1: timed out after 600 s waiting for the launcher launcher log tail",
        "  FAILED    0.0 s  Wait for the launcher's ADDED  [1 host: 1 failed]",
    ]


def test_ignored_failure_is_not_a_failed_task(cb):
    t = task("Probe")
    cb.v2_playbook_on_task_start(t, False)
    cb.v2_runner_on_failed(result("h", t, failed=True, msg="no"), ignore_errors=True)
    cb.v2_playbook_on_task_start(task("Next"), False)
    assert cb.screen.lines == ["  FAILED (ignored) h: no", "  done      0.0 s  Probe  [1 host: 1 failed, 1 ignored]"]


def test_retry_line_shows_the_modules_progress_and_goes_to_the_log(cb):
    t = task("Wait for the launcher's ADDED")
    cb.v2_playbook_on_task_start(t, False)
    msg = "waiting for the launcher to confirm ADDED: confirmed [10.0.0.5], pending [10.0.0.4], 42 s left"
    cb.v2_runner_retry(result("10.0.0.1", t, msg=msg, settled=False, retries=63, attempts=1))
    assert cb.screen.lines == ["  ...    10.0.0.1: %s (retry 1, 62 left)" % msg]
    log = cb.logfile.read_text()
    assert "FAILED - RETRYING: [10.0.0.1]: Wait for the launcher's ADDED (62 retries left)." in log
    assert msg in log


def test_full_default_output_goes_to_the_log_file_only(cb):
    t = task("Configure")
    cb.v2_playbook_on_task_start(t, False)
    cb.v2_runner_on_ok(result("10.0.0.2", t, changed=True))
    log = cb.logfile.read_text()
    assert "TASK [Configure]" in log and "changed: [10.0.0.2]" in log
    assert not any("TASK [" in line for line in cb.screen.lines)


def test_slow_task_line_from_the_timer(cb):
    t = task("Prepare data")
    cb.v2_playbook_on_task_start(t, False)
    cb.clock.now += 7
    cb._still_running(cb._task)
    assert cb.screen.lines == ["  ...       7.0 s  Prepare data  (running)"]
    # once the task finished, a late timer prints nothing
    stale = cb._task
    cb.v2_runner_on_ok(result("h", t))
    cb.v2_playbook_on_task_start(task("Next"), False)
    cb._still_running(stale)
    assert cb.screen.lines[-1] == "  done      7.0 s  Prepare data  [1 host: 1 ok]"


def test_one_line_joins_lines_drops_banners_and_shortens():
    assert progress.one_line("\n  a long message  \nsecond") == "a long message second"
    assert progress.one_line("x" * 400, limit=10) == "xxxxxxx..."
    ssh = ("Failed to connect to the host via ssh: @@@@@@@@@@@@@@@@@@@@\n"
           "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n@@@@@@@@@@@@@@@@@@@@\n")
    expected = "Failed to connect to the host via ssh: @ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @"
    assert progress.one_line(ssh) == expected


def test_short_name_drops_the_collection_of_the_role():
    assert progress.short_name("dynatrain.elastic.cluster : Launch the master") == "cluster : Launch the master"
    assert progress.short_name("Wait for the launcher's ADDED: now") == "Wait for the launcher's ADDED: now"
