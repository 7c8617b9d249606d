# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""Job arrays (playbooks/job_array.yml): the manifest, the rows' settings and ``array.json``.

The manifest is a CSV file with the header ``region,name,workers,args``, one job per row;
``args`` holds the training script's arguments as one shell-quoted string. Every row is
checked before anything is created (``plan_array``), each problem naming the row's line
and what to change. A row becomes a cluster ``<array>-<name>`` in its region, with a VPC
and subnet CIDR of its own: row i (from 0) moves the second octet of ``dt_vpc_cidr`` /
``dt_subnet_cidr`` by 1 + i.

``<dt_state_dir>/arrays/<array>/array.json`` records every row's state (``queued``,
``running``, ``finished``, ``failed``), written atomically under a lock on a sidecar file
(``array.json.lock``) by the array's playbook and by each row's ``run_job.yml``
(module ``dynatrain.elastic.job_array_state``). ``table_lines`` is status's view of it.
Standard library only, and the settings rules of preflight.py (split_args, networks_problem).
"""

from __future__ import annotations

import csv
import datetime
import fcntl
import ipaddress
import json
import os
import re
import tempfile

from ansible_collections.dynatrain.elastic.plugins.module_utils.preflight import (
    CLUSTER_RE,
    ENGINES,
    networks_problem,
    split_args,
)

COLUMNS = ("region", "name", "workers", "args")
# Columns a manifest may add: engine (the row's dt_engine, mxnet or torch; empty: the array's).
OPTIONAL_COLUMNS = ("engine",)
STATES = ("queued", "running", "finished", "failed")
DONE_STATES = ("finished", "failed")
# As playbooks/preflight.yml checks dt_region.
REGION_RE = re.compile(r"^[a-z]{2}(-[a-z]+)+-[0-9]+$")
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
# CLUSTER_RE (preflight's): as roles/cluster/tasks/preflight.yml checks cluster_name.
CLUSTER_MAX = 31
ARRAY_FILE = "array.json"


# -- names -------------------------------------------------------------------------
def array_name_from(path: str) -> str:
    """The default array name: the manifest's file stem, lower case, other characters '-'.

    ``My Jobs_2024.csv`` -> ``my-jobs-2024``; a stem that does not start with a letter
    gets ``a`` in front (cluster names start with a letter).
    """
    stem = os.path.splitext(os.path.basename(str(path or "")))[0].lower()
    name = re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]", "-", stem)).strip("-")
    if name and not name[0].isalpha():
        name = "a" + name
    return name


def array_name_problem(name) -> str:
    """Why ``name`` cannot name an array (empty string when it can)."""
    if not isinstance(name, str) or not name:
        return "array_name is empty: pass -e array_name=<name> (a letter, then letters, digits or '-')."
    if not re.match(r"^[a-z][a-z0-9-]*$", name) or name.endswith("-"):
        return (f"array_name={name} is not valid: use a lower-case letter, then lower-case letters, digits "
                f"or '-' (it begins every cluster name of the array), e.g. -e array_name={array_name_from(name) or 'jobs'}.")
    return ""


# -- the manifest -------------------------------------------------------------------
def _rows_of(text: str):
    """(line number, dict) per data row; raises ValueError on a bad header."""
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1)
             if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise ValueError("it holds no header and no rows: give a CSV file whose first line is "
                         f"'{','.join(COLUMNS)}', then one row per job.")
    header_line, header_text = lines[0]
    header = [h.strip().lower() for h in next(csv.reader([header_text], skipinitialspace=True))]
    if sorted(h for h in header if h not in OPTIONAL_COLUMNS) != sorted(COLUMNS) or len(set(header)) != len(header):
        missing = [c for c in COLUMNS if c not in header]
        extra = [h for h in header if h not in COLUMNS + OPTIONAL_COLUMNS]
        what = "; ".join(p for p in (f"missing {', '.join(missing)}" if missing else "",
                                     f"unknown {', '.join(extra)}" if extra else "",
                                     "a column is repeated" if not missing and not extra else "") if p)
        raise ValueError(f"line {header_line}: the header is '{header_text.strip()}' ({what}): "
                         f"make it '{','.join(COLUMNS)}' (in any order; an '{OPTIONAL_COLUMNS[0]}' column may follow).")
    rows = []
    for number, line in lines[1:]:
        try:
            cells = next(csv.reader([line], skipinitialspace=True, strict=True))
        except csv.Error as exc:
            cells = exc
        rows.append((number, cells, header))
    return rows


def _row_problems(number, cells, header):
    """(row dict or None, [problems]) of one data row."""
    where = f"line {number}"
    if isinstance(cells, csv.Error):
        return None, [f"{where}: not a CSV row ({cells}): close the quotes around args, e.g. us-east-1,a,1,\"--note 'x y'\"."]
    if len(cells) != len(header):
        return None, [f"{where}: {len(cells)} fields where the header has {len(header)} ({','.join(header)}): "
                      "quote an args value that holds a comma, e.g. \"--epochs 3 --layers 64,32\"."]
    row = {key: value.strip() for key, value in zip(header, cells)}
    where = f"line {number} (name '{row['name']}')" if row["name"] else where
    problems = []
    if not REGION_RE.match(row["region"]):
        problems.append(f"{where}: region '{row['region']}' is not a region name: write e.g. us-east-1 or eu-west-1.")
    if not NAME_RE.match(row["name"]):
        problems.append(f"{where}: name '{row['name']}' is not valid: use lower-case letters, digits and '-' "
                        "(not first or last); it names the job and its cluster.")
    workers = int(row["workers"]) if re.fullmatch(r"[0-9]+", row["workers"]) else None
    if workers is None:
        problems.append(f"{where}: workers '{row['workers']}' is not valid: give a whole number >= 0 "
                        "(the base workers besides the master, as bootstrap's worker_count).")
    try:
        args = split_args(row["args"])
    except ValueError as exc:
        args = None
        problems.append(f"{where}: args '{row['args']}' cannot be split like a shell line ({exc}): "
                        "close the quote, e.g. --note 'two words'.")
    engine = row.get("engine", "")
    if engine and engine not in ENGINES:
        problems.append(f"{where}: engine '{engine}' is not an engine: write mxnet (Apache MXNet 1.9.1), torch (PyTorch) "
                        "or leave it empty for the array's (array_vars' dt_engine, default mxnet).")
    return {"line": number, "region": row["region"], "name": row["name"], "workers": workers,
            "args": args, "args_text": row["args"], "engine": engine}, problems


def parse_manifest(text: str) -> tuple[list, list]:
    """The manifest's rows and its problems (each naming the line and what to change)."""
    try:
        raw = _rows_of((text or "").lstrip("\ufeff"))
    except ValueError as exc:
        return [], [str(exc)]
    rows, problems = [], []
    for number, cells, header in raw:
        row, found = _row_problems(number, cells, header)
        problems += found
        if row is not None:
            rows.append(row)
    if not raw:
        problems.append("it has a header but no rows: add one line per job, e.g. us-east-1,first,1,--epochs 3")
    seen = {}
    for row in rows:
        if row["name"] in seen:
            problems.append(f"line {row['line']} (name '{row['name']}'): the name is used on line {seen[row['name']]} "
                            "too: every job of an array needs a name of its own.")
        else:
            seen[row["name"]] = row["line"]
    return rows, problems


# -- the rows' networks -------------------------------------------------------------------
def shifted_cidr(cidr: str, by: int) -> str:
    """``cidr`` with its second octet moved by ``by`` (ValueError when it leaves 0..255)."""
    net = ipaddress.ip_network(cidr, strict=True)
    octets = [int(o) for o in str(net.network_address).split(".")]
    octets[1] += by
    if not 0 <= octets[1] <= 255:
        raise ValueError(f"moving {cidr}'s second octet by {by} leaves 0..255")
    return "%s/%d" % (".".join(str(o) for o in octets), net.prefixlen)


def network_problem(vpc_cidr: str, subnet_cidr: str, rows: int) -> str:
    """Why the rows' networks cannot be derived from these CIDRs (empty string when they can).

    The networks themselves (IPv4, /16 to /28, the subnet inside the VPC) are preflight's rule; a VPC
    of /16 or smaller also keeps the rows' VPCs apart when each row moves the second octet."""
    problem = networks_problem(vpc_cidr, subnet_cidr)
    if problem:
        return problem
    vpc = ipaddress.ip_network(vpc_cidr, strict=True)
    first, second = str(vpc.network_address).split(".")[:2]
    last = int(second) + rows
    if last > 255:
        return (f"dt_vpc_cidr={vpc_cidr}: {rows} rows move its second octet up to {last}, past 255: "
                f"start lower, e.g. -e dt_vpc_cidr={first}.10.0.0/16 with a subnet in it.")
    return ""


# -- the plan ------------------------------------------------------------------------
def plan_array(text: str, array: str, vpc_cidr: str, subnet_cidr: str, max_workers: int = 0) -> dict:
    """Check the manifest and give each row its cluster settings.

    Returns ``{"rows": [...], "errors": [...]}``; with errors, nothing should be created.
    ``max_workers`` (the cluster's, the master counted) bounds workers when > 0.
    """
    errors = []
    problem = array_name_problem(array)
    if problem:
        errors.append(problem)
    rows, problems = parse_manifest(text)
    errors += problems
    max_workers = int(max_workers or 0)
    for row in rows:
        cluster = f"{array}-{row['name']}"
        if not problem and NAME_RE.match(row["name"]) and not CLUSTER_RE.match(cluster):
            errors.append(f"line {row['line']} (name '{row['name']}'): the cluster name {cluster} is longer than "
                          f"{CLUSTER_MAX} characters: shorten the name or the array's (-e array_name=...).")
        if max_workers and row["workers"] is not None and row["workers"] + 1 > max_workers:
            errors.append(f"line {row['line']} (name '{row['name']}'): workers {row['workers']} is more than "
                          f"max_workers={max_workers} allows (the master counts): at most {max_workers - 1}, "
                          "or pass a larger -e max_workers.")
    problem = network_problem(vpc_cidr, subnet_cidr, len(rows))
    if problem:
        errors.append(problem)
    if errors:
        return {"rows": [], "errors": errors}
    planned = []
    for index, row in enumerate(rows):
        planned.append(dict(row, index=index, cluster=f"{array}-{row['name']}",
                            vpc_cidr=shifted_cidr(vpc_cidr, 1 + index),
                            subnet_cidr=shifted_cidr(subnet_cidr, 1 + index)))
    return {"rows": planned, "errors": []}


# -- array.json -------------------------------------------------------------------------
def now_iso(now: float | None = None) -> str:
    when = datetime.datetime.now(datetime.timezone.utc) if now is None else \
        datetime.datetime.fromtimestamp(now, datetime.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text) -> float | None:
    if not text:
        return None
    try:
        when = datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
    except (TypeError, ValueError):
        return None
    return when.replace(tzinfo=datetime.timezone.utc).timestamp()


def new_array(array: str, manifest: str, rows: list, log_dir: str, now: float | None = None) -> dict:
    """A fresh array document: every row queued."""
    return {
        "array": array,
        "manifest": manifest,
        "created": now_iso(now),
        "ended": None,
        "rows": [
            {"name": r["name"], "line": r.get("line"), "region": r["region"], "cluster": r["cluster"],
             "workers": r.get("workers"), "args": r.get("args_text", ""), "state": "queued",
             "result": None, "error": None, "started": None, "ended": None, "duration_s": None,
             "log": os.path.join(log_dir, r["name"] + ".log")}
            for r in rows
        ],
    }


def set_row(doc: dict, name: str, state: str | None = None, error: str | None = None,
            result: str | None = None, now: float | None = None) -> dict:
    """Change one row: its state (times follow it), error line and result URL."""
    for row in doc.get("rows", []):
        if row["name"] == name:
            break
    else:
        raise KeyError(f"array {doc.get('array')} has no row named {name}")
    if state is not None:
        if state not in STATES:
            raise ValueError(f"state {state} is not one of {', '.join(STATES)}")
        row["state"] = state
        if state == "running":
            row.update(started=now_iso(now), ended=None, duration_s=None, error=None)
        elif state in DONE_STATES:
            row["ended"] = now_iso(now)
            started = parse_iso(row.get("started"))
            ended = parse_iso(row["ended"])
            row["duration_s"] = round(ended - started, 1) if started is not None and ended is not None else None
    if error is not None:
        row["error"] = error or None
    if result is not None:
        row["result"] = result or None
    return doc


def end_array(doc: dict, now: float | None = None) -> dict:
    """The array has ended: a row still queued or running never reported an end, so it failed."""
    for row in doc.get("rows", []):
        if row["state"] not in DONE_STATES:
            set_row(doc, row["name"], "failed",
                    error=row.get("error") or f"its run ended without reporting a result ({row['state']}): see {row['log']}",
                    now=now)
    doc["ended"] = now_iso(now)
    return doc


def summary(doc: dict) -> dict:
    """Wall time of the array (first start to last end), the sum of its rows' times, failed rows."""
    rows = doc.get("rows", [])
    starts = [parse_iso(r.get("started")) for r in rows if r.get("started")]
    ends = [parse_iso(r.get("ended")) for r in rows if r.get("ended")]
    wall = round(max(ends) - min(starts), 1) if starts and ends else None
    rows_s = round(sum(r.get("duration_s") or 0 for r in rows), 1)
    return {
        "wall_s": wall,
        "rows_s": rows_s,
        "speedup": round(rows_s / wall, 2) if wall else None,
        "counts": {s: sum(1 for r in rows if r.get("state") == s) for s in STATES},
        "failed": [r["name"] for r in rows if r.get("state") == "failed"],
    }


def _cell(value, width):
    text = "-" if value in (None, "") else str(value)
    return text.ljust(width)


def table_lines(doc: dict) -> list:
    """One line per job (name, region, cluster, state, time, result or error), then the totals."""
    rows = doc.get("rows", [])
    head = ("JOB", "REGION", "CLUSTER", "STATE", "TIME", "RESULT / ERROR")
    cells = [(r["name"], r["region"], r["cluster"], r["state"],
              "%.0f s" % r["duration_s"] if r.get("duration_s") is not None else "-",
              r.get("result") if r.get("state") != "failed" else "ERROR: %s" % (r.get("error") or "unknown"))
             for r in rows]
    widths = [max([len(head[i])] + [len(str(c[i] or "-")) for c in cells]) for i in range(5)]
    lines = ["  ".join(_cell(v, w) for v, w in zip(head[:5], widths)) + "  " + head[5]]
    lines += ["  ".join(_cell(v, w) for v, w in zip(c[:5], widths)) + "  " + (c[5] or "-") for c in cells]
    s = summary(doc)
    counts = ", ".join(f"{n} {state}" for state, n in s["counts"].items() if n)
    total = f"array {doc.get('array')}: {len(rows)} jobs ({counts})"
    if s["wall_s"] is not None:
        total += f"; wall time {s['wall_s']:.0f} s vs {s['rows_s']:.0f} s for the jobs one after another"
        if s["speedup"]:
            total += f" ({s['speedup']:.2f}x)"
    lines.append(total)
    return lines


def read_array(path: str) -> dict:
    with open(path, encoding="utf-8") as handle:
        doc = json.load(handle)
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise ValueError(f"{path} is not an array file (a JSON object with 'rows')")
    return doc


def _write(path: str, doc: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=os.path.dirname(path) or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(doc, handle, indent=2, sort_keys=False)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def update_array(path: str, change) -> dict:
    """Read, change (``change(doc) -> doc``; ``doc`` is None when the file is missing) and write
    ``path`` atomically, under an exclusive lock of ``path.lock``. Returns the new document."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".lock", "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            doc = read_array(path) if os.path.exists(path) else None
            doc = change(doc)
            _write(path, doc)
            return doc
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
