"""`make demo` shows elasticity as a level (issue 43): the summary's samples/s table has one row per stretch
of one world size, in time order (world 2 -> 3 -> 2), each counted over the epochs that ran wholly at that
size, and the demo holds each world for --hold-epochs before the next change.

tests/unit/fixtures/events_demo_level.jsonl is a demo-shaped run (60 epochs, --sample-cost-ms 6): world 2
for 12 epochs, a worker added (world 3 for 7), removed (world 2 for the remaining 41)."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
FIXTURES = os.path.join(ROOT, "tests", "unit", "fixtures")


@pytest.fixture(scope="module")
def demo():
    spec = importlib.util.spec_from_file_location("dt_demo_level", os.path.join(ROOT, "scripts", "demo.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load(name):
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def epoch(gen, world, rate):
    return {"event": "epoch", "generation": gen, "world": world, "samples_per_s": rate}


def test_the_table_reads_world_2_then_3_then_2_each_over_5_epochs(demo):
    rows = demo.world_segments(load("events_demo_level.jsonl"))
    assert [(w, n) for w, _rate, n in rows] == [(2, 11), (3, 6), (2, 40)]
    # each stretch's first epoch mixes the world before (or is the job's start-up) and is not counted
    assert rows[0][1] == pytest.approx(325.1, abs=0.05)
    assert rows[1][1] == pytest.approx(419.0, abs=0.05)
    assert rows[2][1] == pytest.approx(326.0, abs=0.05)
    assert all(n >= 5 for _w, _rate, n in rows)
    assert rows[1][1] > rows[0][1] and rows[1][1] > rows[2][1]  # the added worker made the job faster


def test_the_summary_prints_the_table_in_time_order(demo):
    lines = demo.throughput_lines(demo.world_segments(load("events_demo_level.jsonl")), hold=5)
    assert lines[0].startswith("  samples/s per world size, in time order (2 -> 3 -> 2;")
    assert lines[1:] == ["    world 2:    325.1 samples/s  (11 epochs)",
                         "    world 3:    419.0 samples/s  (6 epochs)",
                         "    world 2:    326.0 samples/s  (40 epochs)"]


def test_a_blink_is_said_to_be_one(demo):
    """The demo before issue 43: the third worker left after one epoch; its figure is no level."""
    events = ([epoch(1, 2, 300.0)] + [epoch(1, 2, 325.0)] * 10 + [epoch(2, 3, 380.0), epoch(2, 3, 436.8)]
              + [epoch(3, 2, 360.0)] + [epoch(3, 2, 326.0)] * 30)
    rows = demo.world_segments(events)
    assert rows == [[2, 325.0, 10], [3, 436.8, 1], [2, 326.0, 30]]
    lines = demo.throughput_lines(rows, hold=5)
    assert "    (world 3 ran fewer than 5 epochs" in lines[-1]
    # a world that changed again before one whole epoch at its size: listed, with no figure
    assert demo.world_segments([epoch(1, 2, 1.0), epoch(1, 2, 2.0), epoch(2, 3, 3.0), epoch(3, 2, 4.0)]) == [
        [2, 2.0, 1], [3, None, 0], [2, None, 0]]
    assert demo.throughput_lines([]) == []


def test_a_restart_at_the_same_size_does_not_count_its_first_epoch(demo):
    events = [epoch(1, 2, 100.0), epoch(1, 2, 300.0), epoch(2, 2, 150.0), epoch(2, 2, 310.0)]
    assert demo.world_segments(events) == [[2, 305.0, 2]]
    assert demo.throughput_by_world(events) == [[2, 305.0, 2]]


def test_current_stretch(demo):
    events = load("events_demo_level.jsonl")
    assert demo.current_stretch([]) == (None, 0)
    assert demo.current_stretch(events) == (2, 40)
    # right after the add is confirmed the job may not have finished an epoch at the new size
    added = next(i for i, e in enumerate(events) if e.get("event") == "generation_start" and e["generation"] == 2)
    assert events[added + 2]["event"] == "epoch"
    assert demo.current_stretch(events[:added + 2]) == (2, 11)
    # its first epoch at world 3 starts the stretch, and counts nothing yet
    assert demo.current_stretch(events[:added + 3]) == (3, 0)


class FakeDemo:
    """Demo.hold's reads, from a list of events growing by one epoch per poll."""

    def __init__(self, demo, events, finished=False):
        self.demo = demo
        self.feed = list(events)
        self.seen = []
        self.finished = finished
        self.polls = 0

    def events(self):
        self.polls += 1
        if self.feed:
            self.seen.append(self.feed.pop(0))
        return list(self.seen)

    def final(self):
        return {"epochs": 60} if self.finished and not self.feed else None

    def wait_for(self, what, predicate, timeout):
        for _try in range(200):
            value = predicate()
            if value:
                return value
        raise AssertionError("never reached: %s" % what)


def test_hold_waits_for_epochs_at_the_grown_world(demo):
    events = [epoch(1, 2, 300.0)] + [epoch(1, 2, 325.0)] * 8 + [epoch(2, 3, 380.0)] + [epoch(2, 3, 420.0)] * 7
    fake = FakeDemo(demo, events)
    assert demo.Demo.hold(fake, 5, 60, world=3) == 3
    # it did not stop at world 2's 8 epochs: it waited for the 5th whole epoch at world 3
    assert demo.current_stretch(fake.seen) == (3, 5)
    fake = FakeDemo(demo, events)
    assert demo.Demo.hold(fake, 5, 60) == 2
    assert demo.current_stretch(fake.seen) == (2, 5)


def test_hold_ends_when_the_job_ends_first(demo):
    fake = FakeDemo(demo, [epoch(1, 2, 300.0), epoch(1, 2, 325.0)], finished=True)
    assert demo.Demo.hold(fake, 5, 60, world=3) == 0


def test_torch_demo_runs_on_a_cluster_of_its_own(demo, monkeypatch):
    monkeypatch.delenv("DT_DEMO_CLUSTER", raising=False)
    args = demo.resolve_target(argparse.Namespace(engine="torch", cluster="", subnet=""))
    assert (args.cluster, args.subnet) == ("dtdemo-torch", "127.78.1.0/24")
    args = demo.resolve_target(argparse.Namespace(engine="mxnet", cluster="", subnet=""))
    assert (args.cluster, args.subnet) == ("dtdemo", "")
    args = demo.resolve_target(argparse.Namespace(engine="torch", cluster="mine", subnet=""))
    assert (args.cluster, args.subnet) == ("mine", "")
    d = demo.Demo(argparse.Namespace(engine="torch", cluster="dtdemo-torch", subnet="127.78.1.0/24",
                                     train_args=["--epochs", "60"], json=True))
    assert d.extra_vars() == {"dt_cluster_name": "dtdemo-torch", "dt_engine": "torch",
                              "dt_subnet_cidr": "127.78.1.0/24", "dt_vpc_cidr": "127.78.0.0/16",
                              "dt_train_script_args": ["--epochs", "60"]}


def test_an_epochs_rate_is_its_own_not_the_launchers_moving_window(demo):
    """samples_per_s averages the last 50 steps (two epochs of the demo's job): after a change it still
    carries the size before. The table takes each epoch's samples over the time since the epoch before."""
    def timed(gen, world, t, window_rate):
        return {"event": "epoch", "generation": gen, "world": world, "time": t, "samples": 1438,
                "samples_per_s": window_rate}
    events = [timed(1, 2, 0.0, 0.0), timed(1, 2, 4.4, 326.8), timed(1, 2, 8.8, 326.8),
              timed(2, 3, 12.0, 380.0), timed(2, 3, 15.4, 400.0), timed(2, 3, 18.8, 422.9)]
    rows = demo.world_segments(events)
    assert [(w, n) for w, _rate, n in rows] == [(2, 2), (3, 2)]
    assert rows[0][1] == pytest.approx(326.8, abs=0.1)
    assert rows[1][1] == pytest.approx(422.9, abs=0.1)   # not (400 + 422.9) / 2: the window's lag
