"""The rules of job arrays (plugins/module_utils/job_array.py): the manifest's checks, each naming the line
and what to change, the rows' clusters and networks, and array.json's rows, times, table and lock."""
from __future__ import annotations

import json
import multiprocessing

import pytest

from ansible_collections.dynatrain.elastic.plugins.module_utils import job_array as ja

GOOD = """region,name,workers,args
us-east-1,first,1,--epochs 3 --lr 0.1
us-west-2,second,0,"--epochs 2 --note 'two words'"
"""


def plan(text, array="jobs", vpc="10.77.0.0/16", subnet="10.77.1.0/24", max_workers=8):
    return ja.plan_array(text, array, vpc, subnet, max_workers)


def one_error(text, **kw):
    result = plan(text, **kw)
    assert result["rows"] == [], "rows are given only when nothing is wrong"
    assert len(result["errors"]) == 1, result["errors"]
    return result["errors"][0]


def test_good_manifest_gives_each_row_its_cluster_network_and_args():
    result = plan(GOOD)
    assert result["errors"] == []
    first, second = result["rows"]
    assert (first["cluster"], first["region"], first["workers"]) == ("jobs-first", "us-east-1", 1)
    assert first["args"] == ["--epochs", "3", "--lr", "0.1"]
    assert second["args"] == ["--epochs", "2", "--note", "two words"]
    # row i moves the second octet by 1 + i: distinct, non-overlapping networks
    assert (first["vpc_cidr"], first["subnet_cidr"]) == ("10.78.0.0/16", "10.78.1.0/24")
    assert (second["vpc_cidr"], second["subnet_cidr"]) == ("10.79.0.0/16", "10.79.1.0/24")
    assert [r["line"] for r in result["rows"]] == [2, 3]


def test_header_in_any_order_blank_lines_comments_and_spaces():
    text = "\ufeff# my jobs\nname, region, args, workers\n\n  # a comment\na, eu-west-1, --epochs 1, 2\n"
    (row,) = plan(text)["rows"]
    assert (row["name"], row["region"], row["workers"], row["args"], row["line"]) == ("a", "eu-west-1", 2, ["--epochs", "1"], 5)


def test_an_engine_column_sets_the_rows_engine():
    text = "region,name,workers,args,engine\nus-east-1,a,1,,torch\nus-east-1,b,1,,\nus-east-1,c,0,--epochs 1,mxnet\n"
    rows = plan(text)["rows"]
    assert [r["engine"] for r in rows] == ["torch", "", "mxnet"]
    assert plan(GOOD)["rows"][0]["engine"] == ""            # no column: the array's engine
    error = one_error("region,name,workers,args,engine\nus-east-1,a,1,,jax\n")
    assert "line 2 (name 'a')" in error and "engine 'jax' is not an engine" in error and "torch" in error
    assert "unknown engines" in one_error("region,name,workers,args,engines\nus-east-1,a,1,,torch\n")


def test_empty_args_keep_the_default_arguments():
    (row,) = plan("region,name,workers,args\nus-east-1,a,1,\n")["rows"]
    assert row["args"] == [] and row["args_text"] == ""


@pytest.mark.parametrize("line, needles", [
    ("US-East,a,1,", ["line 2 (name 'a')", "region 'US-East' is not a region name", "us-east-1"]),
    ("useast1,a,1,", ["region 'useast1'"]),
    ("us-east-1,My_Job,1,", ["line 2 (name 'My_Job')", "name 'My_Job' is not valid", "lower-case letters, digits and '-'"]),
    ("us-east-1,-a,1,", ["name '-a' is not valid"]),
    ("us-east-1,,1,", ["line 2: name '' is not valid"]),
    ("us-east-1,a,-1,", ["workers '-1' is not valid", "whole number >= 0"]),
    ("us-east-1,a,two,", ["workers 'two' is not valid"]),
    ("us-east-1,a,1.5,", ["workers '1.5' is not valid"]),
    ("us-east-1,a,1,--note 'unclosed", ["args '--note 'unclosed' cannot be split like a shell line", "close the quote"]),
    ('us-east-1,a,1,"--epochs 2', ["line 2: not a CSV row", "close the quotes"]),
    ("us-east-1,a,1,--epochs 3,--lr 0.1", ["line 2: 5 fields where the header has 4", "quote an args value"]),
])
def test_a_bad_row_names_its_line_and_what_to_change(line, needles):
    problem = one_error("region,name,workers,args\n" + line + "\n")
    for needle in needles:
        assert needle in problem, problem


def test_workers_beyond_max_workers_are_refused_with_the_limit():
    problem = one_error("region,name,workers,args\nus-east-1,big,8,\n", max_workers=8)
    assert "line 2 (name 'big'): workers 8 is more than max_workers=8 allows" in problem
    assert "at most 7" in problem
    assert plan("region,name,workers,args\nus-east-1,big,7,\n", max_workers=8)["errors"] == []


def test_duplicate_names_name_both_lines():
    problem = one_error("region,name,workers,args\nus-east-1,a,1,\nus-west-2,b,1,\neu-west-1,a,0,\n")
    assert problem.startswith("line 4 (name 'a'): the name is used on line 2 too")


def test_every_problem_is_reported_at_once():
    errors = plan("region,name,workers,args\nXX,a,1,\nus-east-1,b,x,\n")["errors"]
    assert [e.split(":", maxsplit=1)[0] for e in errors] == ["line 2 (name 'a')", "line 3 (name 'b')"]


@pytest.mark.parametrize("text, needle", [
    ("", "holds no header and no rows"),
    ("# only a comment\n", "holds no header and no rows"),
    ("region,name,workers,args\n", "has a header but no rows"),
    ("region,name,args\nus-east-1,a,--x\n", "line 1: the header is 'region,name,args' (missing workers)"),
    ("region,name,workers,args,zone\n", "unknown zone"),
    ("region,name,workers,workers\n", "missing args"),
])
def test_bad_header_or_no_rows(text, needle):
    assert needle in one_error(text)


def test_cluster_name_too_long_says_to_shorten():
    problem = one_error("region,name,workers,args\nus-east-1,a-very-long-job-name-here,1,\n", array="my-array-name")
    assert "the cluster name my-array-name-a-very-long-job-name-here is longer than 31 characters" in problem
    assert "-e array_name=" in problem


@pytest.mark.parametrize("array, needle", [
    ("", "array_name is empty"),
    ("Jobs", "array_name=Jobs is not valid"),
    ("1jobs", "array_name=1jobs is not valid"),
    ("jobs-", "array_name=jobs- is not valid"),
])
def test_bad_array_name(array, needle):
    assert needle in plan(GOOD, array=array)["errors"][0]


@pytest.mark.parametrize("path, name", [
    ("jobs.csv", "jobs"),
    ("/tmp/My Jobs_2024.csv", "my-jobs-2024"),
    ("2024--runs.csv", "a2024-runs"),
    ("manifest", "manifest"),
    ("___.csv", ""),
])
def test_array_name_from_the_manifest_stem(path, name):
    assert ja.array_name_from(path) == name
    assert name == "" or ja.array_name_problem(name) == ""


@pytest.mark.parametrize("vpc, subnet, needle", [
    ("10.0.0.0/8", "10.0.1.0/24", "must be an IPv4 network of /16 or smaller"),
    ("10.77.0.0/16", "10.88.1.0/24", "is not inside dt_vpc_cidr"),
    ("10.77.0.5/16", "10.77.1.0/24", "host bits set"),
    ("10.254.0.0/16", "10.254.1.0/24", "move its second octet up to 256, past 255"),
])
def test_networks_that_cannot_be_moved(vpc, subnet, needle):
    assert needle in one_error(GOOD, vpc=vpc, subnet=subnet)


def test_loopback_networks_of_the_local_cloud():
    rows = plan(GOOD, vpc="127.77.0.0/16", subnet="127.77.1.0/24")["rows"]
    assert [r["subnet_cidr"] for r in rows] == ["127.78.1.0/24", "127.79.1.0/24"]


# -- array.json ------------------------------------------------------------------------------
def new_doc(tmp_path):
    rows = plan(GOOD)["rows"]
    return ja.new_array("jobs", "jobs.csv", rows, str(tmp_path), now=1000.0)


def test_new_array_queues_every_row_with_its_log(tmp_path):
    doc = new_doc(tmp_path)
    assert [(r["name"], r["state"], r["cluster"], r["log"]) for r in doc["rows"]] == [
        ("first", "queued", "jobs-first", str(tmp_path / "first.log")),
        ("second", "queued", "jobs-second", str(tmp_path / "second.log"))]
    assert doc["created"] == "1970-01-01T00:16:40Z" and doc["ended"] is None


def test_row_times_follow_its_state(tmp_path):
    doc = new_doc(tmp_path)
    ja.set_row(doc, "first", "running", now=1000.0)
    ja.set_row(doc, "first", "finished", result="s3://b/jobs-first/first/results/final.json", now=1130.0)
    row = doc["rows"][0]
    assert (row["started"], row["ended"], row["duration_s"]) == ("1970-01-01T00:16:40Z", "1970-01-01T00:18:50Z", 130.0)
    assert row["result"] == "s3://b/jobs-first/first/results/final.json" and row["error"] is None
    with pytest.raises(KeyError, match="no row named third"):
        ja.set_row(doc, "third", "running")
    with pytest.raises(ValueError, match="state done is not one of"):
        ja.set_row(doc, "first", "done")


def test_end_fails_rows_that_never_reported_and_summary_compares_wall_with_sum(tmp_path):
    doc = new_doc(tmp_path)
    ja.set_row(doc, "first", "running", now=1000.0)
    ja.set_row(doc, "second", "running", now=1010.0)
    ja.set_row(doc, "first", "finished", now=1200.0)
    ja.end_array(doc, now=1300.0)
    second = doc["rows"][1]
    assert second["state"] == "failed" and "ended without reporting a result (running)" in second["error"]
    assert second["log"] in second["error"]
    s = ja.summary(doc)
    assert (s["wall_s"], s["rows_s"], s["failed"]) == (300.0, 490.0, ["second"])
    assert s["counts"] == {"queued": 0, "running": 0, "finished": 1, "failed": 1}


def test_table_has_a_line_per_job_and_the_totals(tmp_path):
    doc = new_doc(tmp_path)
    ja.set_row(doc, "first", "running", now=1000.0)
    ja.set_row(doc, "first", "finished", result="s3://b/k", now=1100.0)
    ja.set_row(doc, "second", "running", now=1000.0)
    ja.set_row(doc, "second", "failed", error="bootstrap failed: vCPU quota", now=1050.0)
    lines = ja.table_lines(doc)
    assert lines[0].split()[:5] == ["JOB", "REGION", "CLUSTER", "STATE", "TIME"]
    assert lines[1].split() == ["first", "us-east-1", "jobs-first", "finished", "100", "s", "s3://b/k"]
    assert lines[2].split()[:6] == ["second", "us-west-2", "jobs-second", "failed", "50", "s"]
    assert lines[2].endswith("ERROR: bootstrap failed: vCPU quota")
    assert lines[3] == ("array jobs: 2 jobs (1 finished, 1 failed); wall time 100 s vs 150 s for the jobs "
                        "one after another (1.50x)")


def _mark_running(args):
    path, name = args
    ja.update_array(path, lambda doc: ja.set_row(doc, name, "running"))


def test_concurrent_updates_lose_nothing(tmp_path):
    names = [f"j{i}" for i in range(12)]
    rows = [{"name": n, "region": "us-east-1", "cluster": "x-" + n} for n in names]
    path = str(tmp_path / "array.json")
    ja.update_array(path, lambda doc: ja.new_array("x", "x.csv", rows, str(tmp_path)))
    # spawn, never fork: pytest has threads by now (moto's server), and a forked child can inherit a
    # lock one of them held and hang for ever (it did, in CI)
    with multiprocessing.get_context("spawn").Pool(6) as pool:
        pool.map(_mark_running, [(path, n) for n in names])
    doc = json.loads((tmp_path / "array.json").read_text())
    assert [r["state"] for r in doc["rows"]] == ["running"] * len(names)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["array.json", "array.json.lock"]  # no temp file left


def test_read_array_refuses_other_json(tmp_path):
    (tmp_path / "a.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="is not an array file"):
        ja.read_array(str(tmp_path / "a.json"))
