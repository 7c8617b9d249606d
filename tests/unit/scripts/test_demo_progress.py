"""The demo's live progress: epoch/membership lines and following the job's files incrementally."""
import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture(scope="module")
def demo():
    spec = importlib.util.spec_from_file_location("dt_demo", os.path.join(ROOT, "scripts", "demo.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EPOCH = {"event": "epoch", "epoch": 4, "step": 310, "world": 3, "samples_per_s": 1234.56, "val_acc": 0.9123,
         "train_loss": 0.3, "generation": 2, "source": "train", "time": 1764115200.0}


def test_epoch_line(demo):
    assert demo.epoch_line(EPOCH) == "    epoch   5  step   310  world 3    1234.6 samples/s  val acc 91.23%"
    assert demo.epoch_line({"event": "epoch", "epoch": 0}).endswith("val acc -")


def test_membership_line(demo):
    entry = (7, "REMOVED", "10.0.0.5", 1, "7 REMOVED 10.0.0.5 1")
    assert demo.membership_line(entry) == "    membership: REMOVED 10.0.0.5  (host_worker_log #7)"


def test_read_lines_since_keeps_partial_line_and_restarts_on_shrink(demo, tmp_path):
    path = tmp_path / "events.jsonl"
    assert demo.read_lines_since(str(path), 0) == ([], 0)
    path.write_text('{"a": 1}\n{"b": ')
    lines, offset = demo.read_lines_since(str(path), 0)
    assert lines == ['{"a": 1}'] and offset == 9
    with open(path, "a") as fh:
        fh.write('2}\n')
    assert demo.read_lines_since(str(path), offset) == (['{"b": 2}'], len(path.read_bytes()))
    path.write_text('{"c": 3}\n')  # replaced by a shorter file (archived job)
    assert demo.read_lines_since(str(path), 100) == (['{"c": 3}'], 9)


def test_the_demo_reads_events_with_the_shared_volumes_reader(demo):
    records, bad = demo.parse_events('{"event": "epoch", "time": 1}\n{"event": \n[1]\n')
    assert records == [{"event": "epoch", "time": 1}] and bad == [2, 3]


def test_follower_prints_only_new_epochs_and_membership_changes(demo, tmp_path):
    said = []
    events = tmp_path / "events.jsonl"
    log = tmp_path / "host_worker_log"
    events.write_text(json.dumps({"event": "generation_start", "generation": 1, "time": 1764115100.0}) + "\n" + json.dumps(EPOCH) + "\n")
    log.write_text("0 ADDED 10.0.0.2 1\n")
    follower = demo.Follower(str(tmp_path), said.append)
    follower.poll()
    assert said == [demo.epoch_line(EPOCH), "    membership: ADDED   10.0.0.2  (host_worker_log #0)"]
    follower.poll()
    assert len(said) == 2  # nothing new, nothing printed
    with open(events, "a") as fh:
        fh.write(json.dumps(dict(EPOCH, epoch=5, world=2)) + "\n")
    with open(log, "a") as fh:
        fh.write("1 REMOVED 10.0.0.2 2\n2 FAILED 10.0.0.3")  # the FAILED line is still being written
    follower.poll()
    assert said[2:] == [demo.epoch_line(dict(EPOCH, epoch=5, world=2)),
                        "    membership: REMOVED 10.0.0.2  (host_worker_log #1)"]


def test_throughput_by_world_leaves_out_each_generations_first_epoch(demo):
    def epoch(gen, world, rate):
        return dict(EPOCH, generation=gen, world=world, samples_per_s=rate)
    events = [epoch(1, 2, 100.0), epoch(1, 2, 300.0), epoch(1, 2, 320.0),     # 100: the job's start
              {"event": "generation_start", "generation": 2},
              epoch(2, 3, 380.0), epoch(2, 3, 480.0), epoch(2, 3, 500.0),      # 380: mixes worlds 2 and 3
              epoch(3, 2, 400.0), epoch(3, 2, 316.0), {"event": "epoch", "generation": 3, "world": 2}]
    assert demo.throughput_by_world(events) == [[2, 312.0, 3], [3, 490.0, 2]]
    assert demo.throughput_by_world([]) == []
