"""The fault campaign's cloud rows (issue 24): playbooks interrupted or overlapping on the local cloud.

Its table (every fault passed, 2026-11-25) is in docs/failures.md.

    .venv/bin/python tests/chaos/cloud_campaign.py                       # every fault, then a table
    .venv/bin/python tests/chaos/cloud_campaign.py --faults two-adds,reconcile-during-add
    .venv/bin/python tests/chaos/cloud_campaign.py --list

``tests/chaos/campaign.py`` injects the runtime's faults (kills, torn lines, damaged checkpoints, a stalled
volume) into a job on 127.x addresses; these need the cloud and Ansible, so they run here, on the local
cloud (``python -m localcloud up``; ``make setup`` first), against one cluster that trains the digits job
(``--audit-samples``) for the whole campaign, the playbooks typed as a user types them at the repository
root.  Each fault:

* ``sigint-add-after-launch`` / ``sigint-add-during-configure`` / ``sigint-add-during-join``: Ctrl-C
  (SIGINT to ``ansible-playbook``'s process group) of ``add_workers.yml -e count=1`` once the launch call
  returned / once the new node's configuration runs / while it waits for the launcher's ADDED;
* ``sigint-remove-midway``: Ctrl-C of ``remove_workers.yml -e count=1`` while it waits for REMOVED;
* ``two-adds``: two ``add_workers.yml -e count=1`` started at the same moment (both must exit 0);
* ``reconcile-during-add``: ``reconcile.yml`` while an ``add_workers.yml`` configures its node (both must
  exit 0);
* ``known-hosts-two-adds``: two adds at once, then the master's ``known_hosts_dynatrain`` must hold both new
  workers (issue 40: each add overwrote it whole with the controller's copy as it had read it);
* ``pool-double-take``: a warm pool of one worker (``reconcile.yml -e dt_warm_pool_size=1``), then two adds
  at once: both exit 0, the job grows by two, and the pool worker joined through exactly one of them (the
  other backed off and launched);
* ``pool-failed-start``: a warm pool of one whose start EC2 refuses for want of capacity (the local cloud's
  ``python -m localcloud no-start-capacity <id>``: StartInstances fails with ``InsufficientInstanceCapacity``,
  HTTP 500, as on AWS), then an add: it exits 0 and says the start failed, a launched worker joined (not the
  pool's), and the pool worker is back in the pool (stopped, its tags as the fill left them:
  ``dynatrain:group=pool``, the claim's token and status undone);
  the refusal is disarmed (``--none``) whatever the add did;
* ``pool-interrupted-fill``: Ctrl-C of ``reconcile.yml -e dt_warm_pool_size=N+1`` while it configures the new
  pool worker; the recovery's reconcile (no pool size) must terminate the worker the fill left running.

Then it recovers as the README tells a user: ``reconcile.yml``, once the interrupted operation's
instances are older than the queued timeout (``-e dt_queued_timeout=QUEUED_TIMEOUT``, 30 s here instead
of 1800, so the campaign does not wait half an hour).  Invariants after each fault's recovery:

* orphans = 0: every pending/running instance of the cluster is in ``host_worker`` and every address
  there is such an instance (none launched and forgotten, none half-joined);
* queued = 0: no instance tagged ``ADD_QUEUED`` / ``REMOVAL_QUEUED`` after the pass;
* the master's ``~dynatrain-launcher/.ssh/known_hosts_dynatrain`` names every worker in ``host_worker`` (the launcher's
  strict host key checking needs it);
* ``host_worker_log`` parses and its SEQ is contiguous from 0;
* the launcher trains: a step past the one before the fault, with ``host_worker``'s membership;

and at the end the job is ended (``train.yml``, ``--epochs`` a few past the current one) and its final
checkpoint's audit must be clean (every sample exactly once per epoch: data lost = 0) with validation
accuracy >= 0.9.  ``recover_s``: from the injection until every invariant held.  The cluster is torn
down at the end (``--keep`` leaves it); the local cloud is left as it was found.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))

import demo  # noqa: E402  (the reader of the cluster's shared volume and status)

from dynatrain_runtime import CheckpointStore, audit_check  # noqa: E402

CLUSTER = "chaoscloud"
# max_workers: the rows add workers one after another (the overlapping ones two at a time); the default 8
# would refuse the last rows' adds.
NET = {"dt_cluster_name": CLUSTER, "dt_vpc_cidr": "127.83.0.0/16", "dt_subnet_cidr": "127.83.1.0/24", "max_workers": 32}
QUEUED_TIMEOUT = 30
LAUNCHER_USER = "dynatrain-launcher"     # dt_launcher_user's default: it holds the known_hosts the launcher checks
TRAIN = ["--epochs", "3000", "--seed", "7", "--audit-samples", "--checkpoint-every", "20", "--step-sleep", "0.2"]
LOG_LINE = re.compile(r"^(\d+) (ADDED|REMOVED|FAILED) (\d{1,3}(?:\.\d{1,3}){3}) (\d+)$")
INVARIANT_WAIT = 240        # s the job has to train again after a recovery


def user_env():
    """A user's shell after `source .venv/bin/activate`: the playbooks find the local cloud themselves."""
    env = {k: os.environ[k] for k in ("HOME", "LANG", "LC_ALL", "TERM", "TMPDIR") if k in os.environ}
    venv_bin = os.path.dirname(sys.executable)
    env.update(PATH=venv_bin + os.pathsep + "/usr/local/bin:/usr/bin:/bin", VIRTUAL_ENV=os.path.dirname(venv_bin),
               ANSIBLE_FORCE_COLOR="0")
    return env


class Playbook:
    """`ansible-playbook NAME.yml -e ...` at the repository root, its output followed line by line."""

    def __init__(self, name, extra, log_dir):
        self.name = name
        self.log = os.path.join(log_dir, "%s-%d.log" % (name, int(time.time() * 1000)))
        self.lines = []
        self.handle = open(self.log, "w")
        self.proc = subprocess.Popen(["ansible-playbook", name + ".yml", "-e", json.dumps(dict(NET, **extra))],
                                     cwd=ROOT, env=user_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True, bufsize=1, start_new_session=True)

    def _pump(self, deadline):
        """Read what is there until ``deadline``; False once the output ended."""
        import select
        while time.monotonic() < deadline:
            ready, _w, _x = select.select([self.proc.stdout], [], [], max(0.0, min(1.0, deadline - time.monotonic())))
            if not ready:
                continue
            line = self.proc.stdout.readline()
            if not line:
                return False
            self.lines.append(line)
            self.handle.write(line)
            self.handle.flush()
        return True

    def wait_line(self, pattern, timeout=600, since=0):
        """Until a line (from line ``since`` on) matches ``pattern`` (a regex): True, or False when the playbook
        ended without one."""
        rx = re.compile(pattern)
        seen = since
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(rx.search(line) for line in self.lines[seen:]):
                return True
            seen = len(self.lines)
            if not self._pump(min(deadline, time.monotonic() + 1.0)):
                return any(rx.search(line) for line in self.lines[seen:])
        return False

    def interrupt(self):
        """Ctrl-C as a terminal sends it: SIGINT to the playbook's process group."""
        os.killpg(self.proc.pid, signal.SIGINT)

    def finish(self, timeout=1500):
        """Read to the end; its exit status (the group killed when it runs past ``timeout``)."""
        deadline = time.monotonic() + timeout
        while self._pump(deadline):
            if time.monotonic() >= deadline:
                break
        try:
            rc = self.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            rc = self.proc.wait(timeout=30)
        self.handle.close()
        return rc

    def tail(self, n=40):
        return "".join(self.lines[-n:])


def run(name, extra, log_dir, timeout=1500):
    book = Playbook(name, extra, log_dir)
    return book.finish(timeout), book


class Cluster:
    def __init__(self, log_dir):
        self.log_dir = log_dir
        self.job = demo.Demo(argparse.Namespace(cluster=CLUSTER, subnet="", json=True, train_args=[]))
        self.job.env = demo.localcloud_env()

    def instances(self):
        """{ip: tags} of the cluster's pending/running nodes (the image builder is none)."""
        ec2 = self.job.boto("ec2")
        out = {}
        filters = [{"Name": "tag:dynatrain:cluster", "Values": [CLUSTER]},
                   {"Name": "instance-state-name", "Values": ["pending", "running"]}]
        for r in ec2.describe_instances(Filters=filters)["Reservations"]:
            for i in r["Instances"]:
                tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
                if tags.get("dynatrain:role") in ("master", "worker"):
                    out[i["PrivateIpAddress"]] = tags
        return out

    def node_ids(self):
        """{ip: instance id} of the cluster's pending/running nodes."""
        ec2 = self.job.boto("ec2")
        filters = [{"Name": "tag:dynatrain:cluster", "Values": [CLUSTER]},
                   {"Name": "instance-state-name", "Values": ["pending", "running"]}]
        return {i["PrivateIpAddress"]: i["InstanceId"] for r in ec2.describe_instances(Filters=filters)["Reservations"]
                for i in r["Instances"]}

    def pool(self):
        """{instance id: (state, tags)} of the cluster's warm pool (tag dynatrain:group=pool), any live state."""
        ec2 = self.job.boto("ec2")
        filters = [{"Name": "tag:dynatrain:cluster", "Values": [CLUSTER]},
                   {"Name": "tag:dynatrain:group", "Values": ["pool"]},
                   {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}]
        return {i["InstanceId"]: (i["State"]["Name"], {t["Key"]: t["Value"] for t in i.get("Tags", [])})
                for r in ec2.describe_instances(Filters=filters)["Reservations"] for i in r["Instances"]}

    def instance(self, iid):
        """(state, tags) of one instance; ("gone", {}) when EC2 no longer has it."""
        ec2 = self.job.boto("ec2")
        found = [i for r in ec2.describe_instances(Filters=[{"Name": "instance-id", "Values": [iid]}])["Reservations"]
                 for i in r["Instances"]]
        if not found or found[0]["State"]["Name"] in ("terminated", "shutting-down"):
            return "gone", {}
        return found[0]["State"]["Name"], {t["Key"]: t["Value"] for t in found[0].get("Tags", [])}

    def master_known_hosts(self):
        """The names in the master's known_hosts_dynatrain (the file the launcher's SSH checks: the launcher
        user's, issue 40)."""
        master = [ip for ip, tags in self.instances().items() if tags.get("dynatrain:role") == "master"]
        if not master:
            return set()
        proc = subprocess.run(["podman", "exec", self.node_ids()[master[0]], "sh", "-c",
                               "cat ~%s/.ssh/known_hosts_dynatrain" % LAUNCHER_USER], env=self.job.env, capture_output=True,
                              text=True, timeout=60, check=False)
        return {name for line in proc.stdout.splitlines() if line.strip() and not line.startswith(("#", "@"))
                for name in line.split()[0].split(",")}

    def elastic_workers(self):
        """The elastic workers in the job (what remove_workers count=N takes, newest first)."""
        hosts = set(self.job.hosts())
        return [ip for ip, tags in self.instances().items() if tags.get("dynatrain:group") == "elastic" and ip in hosts]

    def log(self):
        lines = self.job.read("host_worker_log").splitlines()
        parsed = [LOG_LINE.match(line) for line in lines]
        return lines, [(int(m.group(1)), m.group(2), m.group(3)) for m in parsed if m]

    def problems(self, step_before):
        """What does not hold yet: [] when every invariant holds."""
        out = []
        nodes = self.instances()
        hosts = self.job.hosts()
        orphans = sorted(set(nodes) - set(hosts))
        missing = sorted(set(hosts) - set(nodes))
        queued = sorted(ip for ip, tags in nodes.items()
                        if tags.get("elastic_worker_status") in ("ADD_QUEUED", "REMOVAL_QUEUED"))
        if orphans:
            out.append("orphans (running, not in host_worker): %s" % orphans)
        if missing:
            out.append("in host_worker but no running instance: %s" % missing)
        if queued:
            out.append("still queued: %s" % queued)
        master_ips = [ip for ip, tags in nodes.items() if tags.get("dynatrain:role") == "master"]
        unknown = sorted(set(hosts) - set(master_ips) - self.master_known_hosts())
        if unknown:
            out.append("not in the master's known_hosts (its launcher cannot reach them): %s" % unknown)
        lines, entries = self.log()
        if len(entries) != len(lines):
            out.append("host_worker_log has lines that do not parse")
        if [e[0] for e in entries] != list(range(len(entries))):
            out.append("host_worker_log SEQ is not contiguous")
        st = self.job.status()
        if not (st.get("state") == "running" and (st.get("step") or 0) > step_before
                and sorted(st.get("membership") or hosts) == sorted(hosts)):
            out.append("the launcher does not train past step %d with host_worker's membership (status %s)"
                       % (step_before, {k: st.get(k) for k in ("state", "step", "world_size")}))
        return out, len(orphans), len(queued)

    def reconcile(self, extra=None):
        rc, book = run("reconcile", dict({"dt_queued_timeout": QUEUED_TIMEOUT}, **(extra or {})), self.log_dir)
        return rc, book


# ------------------------------------------------------------------------------------------ faults
def sigint_add(cluster, moment):
    patterns = {"launch": r"TASK \[dynatrain\.elastic\.fleet : Wait for SSH on each node",
                "configure": r"TASK \[dynatrain\.elastic\.(node_base|efs|mxnet)",
                "join": r"TASK \[Wait for the launcher's ADDED"}
    add = Playbook("add_workers", {"count": 1}, cluster.log_dir)
    if not add.wait_line(patterns[moment]):
        add.finish()
        raise RuntimeError("add_workers ended before the moment to interrupt it:\n" + add.tail())
    time.sleep(1.0)
    add.interrupt()
    rc = add.finish(300)
    return "add_workers interrupted at %s (rc %d)" % (moment, rc)


def sigint_remove(cluster):
    rm = Playbook("remove_workers", {"count": 1}, cluster.log_dir)
    if not rm.wait_line(r"TASK \[Wait for the launcher's REMOVED"):
        rm.finish()
        raise RuntimeError("remove_workers ended before the moment to interrupt it:\n" + rm.tail())
    time.sleep(1.0)
    rm.interrupt()
    rc = rm.finish(300)
    return "remove_workers interrupted while waiting for REMOVED (rc %d)" % rc


def both_ok(*books):
    """Each playbook's exit status must be 0: a fault whose operation failed is a failed row, not a recovery."""
    failed = [(book.name, rc, book) for book, rc in books if rc != 0]
    if failed:
        raise RuntimeError("; ".join("%s exited %d:\n%s" % (name, rc, book.tail()) for name, rc, book in failed))


def two_adds(cluster):
    first = Playbook("add_workers", {"count": 1}, cluster.log_dir)
    second = Playbook("add_workers", {"count": 1}, cluster.log_dir)
    rcs = (first.finish(), second.finish())
    both_ok((first, rcs[0]), (second, rcs[1]))
    return "two add_workers at once (rc %d, %d)" % rcs


def reconcile_during_add(cluster):
    add = Playbook("add_workers", {"count": 1}, cluster.log_dir)
    if not add.wait_line(r"TASK \[dynatrain\.elastic\.(node_base|efs|mxnet)"):
        add.finish()
        raise RuntimeError("add_workers ended before its configuration:\n" + add.tail())
    rec_rc, rec = run("reconcile", {}, cluster.log_dir)
    add_rc = add.finish()
    both_ok((rec, rec_rc), (add, add_rc))
    return "reconcile during an add (reconcile rc %d, add_workers rc %d)" % (rec_rc, add_rc)


def known_hosts_two_adds(cluster):
    before = set(cluster.job.hosts())
    what = two_adds(cluster)
    new = sorted(set(cluster.job.hosts()) - before)
    missing = sorted(set(new) - cluster.master_known_hosts())
    if len(new) != 2 or missing:
        raise RuntimeError("%s: new workers %s, not in the master's known_hosts: %s" % (what, new, missing))
    return "%s; the master's known_hosts names both new workers %s" % (what, new)


def fill_pool(cluster, size):
    """The warm pool at ``size`` stopped workers (reconcile's refill); their ids."""
    rc, book = cluster.reconcile({"dt_warm_pool_size": size})
    if rc != 0:
        raise RuntimeError("could not fill the warm pool:\n" + book.tail())
    stopped = [iid for iid, (state, _tags) in cluster.pool().items() if state == "stopped"]
    if len(stopped) < size:
        raise RuntimeError("the warm pool has %d stopped workers, not %d" % (len(stopped), size))
    return stopped


def pool_double_take(cluster):
    pooled = fill_pool(cluster, 1)
    before = set(cluster.job.hosts())
    first = Playbook("add_workers", {"count": 1}, cluster.log_dir)
    second = Playbook("add_workers", {"count": 1}, cluster.log_dir)
    rcs = (first.finish(), second.finish())
    both_ok((first, rcs[0]), (second, rcs[1]))
    new = set(cluster.job.hosts()) - before
    ids = cluster.node_ids()
    joined_from_pool = [ip for ip in new if ids.get(ip) in pooled]
    backed_off = sum("taken by another add" in "".join(book.lines) for book in (first, second))
    if len(new) != 2 or len(joined_from_pool) != 1:
        raise RuntimeError("two adds with a pool of one (rc %d, %d): %d new workers, %d of them the pool's"
                           % (rcs + (len(new), len(joined_from_pool))))
    return "two adds, a pool of one (rc %d, %d): 2 new workers, the pool's joined once; %d add(s) backed off" % (
        rcs + (backed_off,))


def no_start_capacity(ids):
    """The local cloud has no capacity to start ``ids`` (``[]``: every start gets it again), as EC2 may lack it for
    a stopped instance's type: ``python -m localcloud no-start-capacity``; then the armed ids, as its status says."""
    for command in (["no-start-capacity"] + (list(ids) or ["--none"]), ["status", "--json"]):
        proc = subprocess.run([sys.executable, "-m", "localcloud"] + command, cwd=ROOT, capture_output=True,
                              text=True, check=False, timeout=60)
        if proc.returncode != 0:
            raise RuntimeError("localcloud %s failed: %s" % (" ".join(command), proc.stderr.strip()))
    return json.loads(proc.stdout).get("no_start_capacity", [])


def pool_failed_start(cluster):
    pooled = fill_pool(cluster, 1)[0]
    before = set(cluster.job.hosts())
    _state, pool_tags = cluster.instance(pooled)
    if no_start_capacity([pooled]) != [pooled]:
        raise RuntimeError("the local cloud did not arm the failed start of %s" % pooled)
    try:
        rc, book = run("add_workers", {"count": 1}, cluster.log_dir)
    finally:
        armed = no_start_capacity([])
    if armed:
        raise RuntimeError("the failed start is still armed for %s" % armed)
    both_ok((book, rc))
    output = " ".join("".join(book.lines).split())    # the YAML callback wraps a long message over lines
    # the take's own words: the fault happened (EC2 refused the start), not some other failure
    if "InsufficientInstanceCapacity" not in output or "given back to the warm pool" not in output:
        raise RuntimeError("add_workers (rc %d) did not report the pool worker's refused start:\n%s"
                           % (rc, book.tail()))
    new = set(cluster.job.hosts()) - before
    new_ids = {cluster.node_ids().get(ip) for ip in new}
    state, tags = cluster.instance(pooled)
    # back in the pool: the claim's tags undone, every tag as the fill left it (a pool worker carries the worker
    # template's status tag, which reconcile does not act on while the group is the pool's)
    if (len(new) != 1 or pooled in new_ids or state != "stopped" or tags.get("dynatrain:group") != "pool"
            or tags != pool_tags):
        changed = {k: (pool_tags.get(k), tags.get(k)) for k in set(tags) | set(pool_tags)
                   if pool_tags.get(k) != tags.get(k)}
        raise RuntimeError("a pool worker whose start failed: %d new workers %s; it is %s, tags changed "
                           "(before, after) %s" % (len(new), sorted(new_ids - {None}), state, changed))
    return ("an add whose pool worker EC2 could not start (InsufficientInstanceCapacity, rc %d): a launched worker "
            "joined, the pool's is back in the pool (stopped)" % rc)


def pool_interrupted_fill(cluster):
    size = len(cluster.pool()) + 1
    fill = Playbook("reconcile", {"dt_queued_timeout": QUEUED_TIMEOUT, "dt_warm_pool_size": size}, cluster.log_dir)
    # reconcile's own configure play (its joins) comes first, with no hosts: wait for the fill's launch
    if not fill.wait_line(r"TASK \[.*Launch the missing pool workers"):
        fill.finish()
        raise RuntimeError("the reconcile pass launched no pool worker:\n" + fill.tail())
    if not fill.wait_line(r"TASK \[dynatrain\.elastic\.(node_base|efs|mxnet|torch)", since=len(fill.lines)):
        fill.finish()
        raise RuntimeError("the pool fill ended before it configured its worker:\n" + fill.tail())
    time.sleep(1.0)
    fill.interrupt()
    rc = fill.finish(300)
    running = [iid for iid, (state, _tags) in cluster.pool().items() if state in ("pending", "running")]
    if not running:
        raise RuntimeError("the interrupted fill left no running pool worker to recover from (rc %d)" % rc)
    return "a pool fill interrupted while it configured %s (rc %d)" % (", ".join(running), rc)


FAULTS = {
    "sigint-add-after-launch": lambda c: sigint_add(c, "launch"),
    "sigint-add-during-configure": lambda c: sigint_add(c, "configure"),
    "sigint-add-during-join": lambda c: sigint_add(c, "join"),
    "sigint-remove-midway": sigint_remove,
    "two-adds": two_adds,
    "reconcile-during-add": reconcile_during_add,
    "known-hosts-two-adds": known_hosts_two_adds,
    "pool-double-take": pool_double_take,
    "pool-failed-start": pool_failed_start,
    "pool-interrupted-fill": pool_interrupted_fill,
}


def run_fault(cluster, name):
    """Inject ``name``, recover with reconcile, wait for the invariants; a row of the table."""
    if name == "sigint-remove-midway" and not cluster.elastic_workers():     # it needs one to remove
        rc, book = run("add_workers", {"count": 1}, cluster.log_dir)
        if rc != 0:
            return dict(fault=name, ok=False, detail="could not add the worker to remove:\n" + book.tail())
    step_before = cluster.job.status().get("step") or 0
    t0 = time.monotonic()
    try:
        what = FAULTS[name](cluster)
    except RuntimeError as exc:
        return dict(fault=name, ok=False, detail=str(exc))
    injected = time.monotonic()
    # the interrupted operation's instances age past the queued timeout, then one reconcile pass
    time.sleep(max(0.0, QUEUED_TIMEOUT + 5 - (time.monotonic() - injected)))
    rc, book = cluster.reconcile()
    if rc != 0:
        return dict(fault=name, ok=False, detail="%s; reconcile failed:\n%s" % (what, book.tail()))
    deadline = time.monotonic() + INVARIANT_WAIT
    while True:
        problems, orphans, queued = cluster.problems(step_before)
        if not problems or time.monotonic() > deadline:
            break
        time.sleep(2)
    detail = what + ("; " + "; ".join(problems) if problems else "")
    return dict(fault=name, ok=not problems, recover_s=round(time.monotonic() - t0, 1), orphans=orphans,
                queued=queued, world=len(cluster.job.hosts()), detail=detail)


def finish_job(cluster):
    """End the job a few epochs on; (audit problems, val_acc)."""
    epoch = cluster.job.status().get("epoch") or 0
    args = [a for a in TRAIN if a not in ("--step-sleep", "0.2")]
    args[args.index("--epochs") + 1] = str(epoch + 3)
    rc, book = run("train", {"train_state": "restarted", "dt_train_script_args": args}, cluster.log_dir)
    if rc != 0:
        return ["train.yml failed:\n" + book.tail()], None
    final = cluster.job.wait_for("the job's final.json", cluster.job.final, 900)
    latest = CheckpointStore(os.path.join(cluster.job.efs_dir(), "checkpoints")).latest()
    if not latest:
        return ["no final checkpoint"], final.get("val_acc")
    meta = latest[1]
    problems = audit_check(meta["audit"], meta["num_samples"])
    return problems, final.get("val_acc")


def table(rows):
    out = ["%-28s %-5s %9s %7s %6s %5s  %s" % ("FAULT", "OK", "RECOVER_S", "ORPHANS", "QUEUED", "WORLD", "WHAT")]
    for r in rows:
        cells = (r["fault"], "PASS" if r["ok"] else "FAIL", r.get("recover_s", "-"), r.get("orphans", "-"),
                 r.get("queued", "-"), r.get("world", "-"), r["detail"])
        out.append("%-28s %-5s %9s %7s %6s %5s  %s" % cells)
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--faults", default=",".join(FAULTS), help="comma-separated [all]")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--keep", action="store_true", help="leave the cluster up at the end")
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(FAULTS))
        return 0
    names = [n for n in args.faults.split(",") if n]
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        ap.error("unknown fault(s) %s; --list names them" % ", ".join(unknown))
    log_dir = os.path.join(ROOT, ".localcloud", "chaos-cloud")
    os.makedirs(log_dir, exist_ok=True)
    status = subprocess.run([sys.executable, "-m", "localcloud", "status"], cwd=ROOT, capture_output=True, text=True,
                            check=False, timeout=60)
    was_up = "daemon     pid" in status.stdout
    subprocess.run([sys.executable, "-m", "localcloud", "up"], cwd=ROOT, check=True, timeout=300)
    try:
        return campaign(args, names, log_dir)
    finally:
        if not was_up and not args.keep:          # the local cloud is left as it was found
            subprocess.run([sys.executable, "-m", "localcloud", "down"], cwd=ROOT, check=False, timeout=300)


def campaign(args, names, log_dir):
    """Bootstrap the campaign's cluster, inject each fault, end the job; the table."""
    cluster = Cluster(log_dir)
    rc, book = run("bootstrap", {"worker_count": 1, "dt_train_script_args": TRAIN}, log_dir)
    if rc != 0:
        print("bootstrap failed:\n" + book.tail(80))
        return 1
    rows = []
    try:
        cluster.job.wait_for("the job to train", lambda: (cluster.job.status().get("step") or 0) > 5, 300)
        for name in names:
            row = run_fault(cluster, name)
            rows.append(row)
            print(table([row]).splitlines()[1], flush=True)
        audit, acc = finish_job(cluster)
        rows.append(dict(fault="(end) exactly once, accuracy", ok=not audit and (acc or 0) >= 0.9,
                         detail="audit %s, val_acc %s" % ("clean" if not audit else audit[:3], acc)))
    finally:
        if not args.keep:
            run("teardown", {"delete_checkpoints": True}, log_dir)
    print()
    print(table(rows))
    print("(playbook logs: %s)" % log_dir)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
