# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: progress
type: stdout
short_description: One line per task, with host counts, failures and what a retrying task waits for
version_added: "0.1.0"
description:
  - A compact stdout callback for long playbooks such as C(dynatrain.elastic.add_workers).
  - It prints one line when a play starts, one line when a task finishes (duration, host
    counts, C(FAILED) when a host failed), a line for each host's failure with its message,
    a line for each retry with the retried result's C(msg), a line when a task runs longer
    than O(slow_after) seconds, and a one-line recap.
  - For C(dynatrain.elastic.host_worker) with O(dynatrain.elastic.host_worker#module:poll)
    the retry lines say which hosts the launcher confirmed so far, which are pending and
    how many seconds are left.
  - Tasks skipped on every host print nothing.
  - With O(log_file), the full output of the C(ansible.builtin.default) callback
    (with the same options) goes to that file as well.
author:
  - dynatrain maintainers (@dynatrain)
requirements:
  - set as stdout callback in configuration (C(ANSIBLE_STDOUT_CALLBACK=dynatrain.elastic.progress))
options:
  log_file:
    description:
      - Also write the default callback's full output to this file (truncated when the
        playbook starts). Not set, only the compact lines are shown.
    type: path
    env:
      - name: DT_PROGRESS_LOG
    ini:
      - section: callback_dynatrain_progress
        key: log_file
  slow_after:
    description:
      - Seconds after which a task that is still running gets a line saying so.
      - V(0) never prints that line.
    type: float
    default: 5
    env:
      - name: DT_PROGRESS_SLOW_AFTER
    ini:
      - section: callback_dynatrain_progress
        key: slow_after
extends_documentation_fragment:
  - default_callback
  - result_format_callback
"""

import re
import threading
import time

from ansible.plugins.callback.default import CallbackModule as DefaultCallback

# Fields of a task's finish line, in this order.
COUNTS = ("ok", "changed", "failed", "unreachable", "skipped", "ignored")
MSG_LIMIT = 300
# runs of a repeated symbol that only decorate a message (ssh's "@@@@@@...")
DECORATION = re.compile(r"([@*=#~-])\1{3,}")
# "namespace.collection.role : task" -> "role : task"
ROLE_PREFIX = re.compile(r"^\w+\.\w+\.(\w+ : )")


def short_name(name):
    """A task's name without its role's collection prefix."""
    return ROLE_PREFIX.sub(r"\1", name.strip())


def one_line(text, limit=MSG_LIMIT):
    """``text`` as one line: its lines joined, banners of repeated symbols (ssh's @@@@) dropped, shortened.

    The first line alone can be a banner (ssh's host key warning); joined, the
    line says what happened, and ``limit`` keeps it short.
    """
    line = " ".join(DECORATION.sub(" ", str(text)).split())
    return line if len(line) <= limit else line[:limit - 3] + "..."


def result_message(result):
    """What a task result says about itself, in one line."""
    for key in ("msg", "stderr", "reason"):
        if result.get(key):
            return one_line(result[key])
    return ""


class TaskTally:
    """The hosts' outcomes of one task."""

    def __init__(self, name, started):
        self.name = name
        self.started = started
        self.counts = dict.fromkeys(COUNTS, 0)

    def add(self, outcome):
        self.counts[outcome] += 1

    @property
    def hosts(self):
        # "changed" and "ignored" hosts are also counted as ok / failed
        return sum(self.counts[k] for k in ("ok", "failed", "unreachable", "skipped"))

    @property
    def all_skipped(self):
        return self.hosts == self.counts["skipped"]

    def line(self, now):
        """The finish line: status, duration, name and the non-zero counts."""
        bad = self.counts["failed"] - self.counts["ignored"] + self.counts["unreachable"]
        word = "FAILED" if bad > 0 else "done"
        counts = ", ".join(f"{n} {k}" for k, n in self.counts.items() if n)
        plural = "" if self.hosts == 1 else "s"
        return f"  {word:<6} {now - self.started:6.1f} s  {self.name}  [{self.hosts} host{plural}: {counts}]"


class _FileDisplay:
    """The default callback's Display, writing its display()/banner() output to a file instead.

    Everything else (verbosity, warnings, errors) is the real Display's.
    """

    def __init__(self, real, handle):
        self._real = real
        self._handle = handle

    def display(self, msg, color=None, stderr=False, screen_only=False, log_only=False, newline=True,
                caplevel=None):
        if self._handle is None or screen_only:
            return
        self._handle.write(msg + ("\n" if newline and not msg.endswith("\n") else ""))
        self._handle.flush()

    def banner(self, msg, color=None, cows=True):
        msg = str(msg).strip()
        self.display(f"\n{msg} {'*' * max(3, 79 - len(msg))}")

    def _error(self, error, stderr=False):
        # a task's error in full goes to the log only: the terminal has the compact FAILED line
        if self._handle is not None:
            type(self._real)._error(self, error, stderr)

    def __getattr__(self, name):
        return getattr(self._real, name)


class CallbackModule(DefaultCallback):
    """Compact lines on stdout; the default callback's full output in the log file."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "dynatrain.elastic.progress"

    def __init__(self, display=None, clock=time.monotonic):
        super().__init__()
        # the real Display (or a test's stand-in) gets the compact lines
        self._out = display or self._display
        self._clock = clock
        self._task = None
        self._timer = None
        self._lock = threading.Lock()
        self._log = None
        # until set_options: the inherited default output goes nowhere
        self._display = _FileDisplay(self._out, None)

    def set_options(self, task_keys=None, var_options=None, direct=None):
        super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        path = self.get_option("log_file")
        if path and self._log is None:
            self._log = open(path, "w", encoding="utf-8")  # pylint: disable=consider-using-with
        self._display = _FileDisplay(self._out, self._log)

    # --- compact output --------------------------------------------------------------

    def say(self, line):
        with self._lock:
            self._out.display(line)

    def _finish_task(self):
        """Print the finish line of the current task (none when every host skipped it)."""
        with self._lock:
            task, self._task = self._task, None
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        if task is not None and not task.all_skipped:
            self.say(task.line(self._clock()))

    def _start_task(self, name):
        self._finish_task()
        tally = TaskTally(name, self._clock())
        with self._lock:
            self._task = tally
        slow_after = float(self.get_option("slow_after") or 0)
        if slow_after > 0:
            timer = threading.Timer(slow_after, self._still_running, args=(tally,))
            timer.daemon = True
            with self._lock:
                self._timer = timer
            timer.start()

    def _still_running(self, tally):
        with self._lock:
            current = self._task is tally
        if current:
            self.say(f"  ...    {self._clock() - tally.started:6.1f} s  {tally.name}  (running)")

    def _tally(self, outcome, *more):
        with self._lock:
            if self._task is not None:
                for name in (outcome,) + more:
                    self._task.add(name)

    # --- callbacks ---------------------------------------------------------------------

    def v2_playbook_on_play_start(self, play):
        super().v2_playbook_on_play_start(play)
        self._finish_task()
        name = play.get_name().strip()
        self.say(f"-- play: {name}" if name else "-- play")

    def v2_playbook_on_task_start(self, task, is_conditional):
        super().v2_playbook_on_task_start(task, is_conditional)
        self._start_task(short_name(task.get_name()))

    def v2_playbook_on_handler_task_start(self, task):
        super().v2_playbook_on_handler_task_start(task)
        self._start_task(f"handler: {short_name(task.get_name())}")

    def v2_runner_on_ok(self, result):
        # read before the default callback cleans the result (it drops debug's "changed")
        changed = bool(result.result.get("changed"))
        super().v2_runner_on_ok(result)
        self._tally("ok", *(("changed",) if changed else ()))

    def v2_runner_on_failed(self, result, ignore_errors=False):
        message = result_message(result.result)
        super().v2_runner_on_failed(result, ignore_errors=ignore_errors)
        self._tally("failed", *(("ignored",) if ignore_errors else ()))
        label = " (ignored)" if ignore_errors else ""
        self.say(f"  FAILED{label} {result.host.get_name()}: {message}")

    def v2_runner_on_unreachable(self, result):
        message = result_message(result.result)
        super().v2_runner_on_unreachable(result)
        self._tally("unreachable")
        self.say(f"  UNREACHABLE {result.host.get_name()}: {message}")

    def v2_runner_on_skipped(self, result):
        super().v2_runner_on_skipped(result)
        self._tally("skipped")

    def v2_runner_item_on_failed(self, result):
        message = result_message(result.result)
        super().v2_runner_item_on_failed(result)
        item = self._get_item_label(result.result)
        self.say(f"  FAILED {result.host.get_name()} (item {item}): {message}")

    def v2_runner_retry(self, result):
        super().v2_runner_retry(result)
        res = result.result
        left = res.get("retries", 0) - res.get("attempts", 0)
        message = result_message(res) or "not there yet"
        # retry lines already show that the task is running
        with self._lock:
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        # the full log gets the retried result's message too (the default callback's line lacks it)
        self._display.display(f"  {message}")
        self.say(f"  ...    {result.host.get_name()}: {message} (retry {res.get('attempts', 0)}, {left} left)")

    def v2_playbook_on_stats(self, stats):
        self._finish_task()
        super().v2_playbook_on_stats(stats)
        parts = []
        for host in sorted(stats.processed.keys()):
            s = stats.summarize(host)
            bad = "" if not (s["failures"] or s["unreachable"]) else " <-- FAILED"
            parts.append(f"{host} ok={s['ok']} changed={s['changed']} failed={s['failures']} "
                         f"unreachable={s['unreachable']}{bad}")
        self.say("-- recap: " + ("; ".join(parts) if parts else "no hosts"))
        if self._log is not None:
            self._log.flush()
