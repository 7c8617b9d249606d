#!/usr/bin/env python3
"""`make demo`: the product end to end on the embedded local cloud.

Starts the local cloud, bootstraps a master + base workers with the real
playbooks, trains the digits example across the nodes (MXNet's parameter
server, or PyTorch with --engine torch: `make demo ENGINE=torch`), (with
--elastic) adds and removes workers while it trains, and prints what happened:
nodes, epochs, accuracy, membership log, samples/s per stretch of one world
size, wall time per phase. The cluster is left up; `make demo-down` removes it.

Elasticity shows as a level, not a blink: the add starts once the first world
has trained --hold-epochs epochs (counted as the samples/s table counts them),
and the removal once the grown world has trained as many, so the table reads
world 2 -> 3 -> 2 with each row resting on at least --hold-epochs epochs.

While a playbook runs, its progress shows as compact task lines (the
collection's `dynatrain.elastic.progress` stdout callback; the full output goes
to .localcloud/demo/<cluster>-<playbook>.log); while the job trains, one line
per epoch and one per membership change, followed from the shared volume.

Also used by the end-to-end test (`--json` prints the summary as JSON only).
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable

# The collection's readers of the shared volume's files (`make collection` links
# .collections/ansible_collections/dynatrain/elastic to this checkout).
sys.path.insert(0, os.path.join(ROOT, ".collections"))
from ansible_collections.dynatrain.elastic.plugins.module_utils.shared_volume import (  # noqa: E402
    HostWorkerError, JobStatusError, parse_events, parse_hosts, parse_status, read_log_since)


class DemoError(RuntimeError):
    pass


ENGINES = ("mxnet", "torch")
# The torch demo's cluster and subnet: beside the MXNet demo's (dtdemo, 127.77.1.0/24), never on it (a
# cluster keeps its engine) and apart from the e2e tests' networks (127.79-127.83, 127.120).
TORCH_DEMO = ("dtdemo-torch", "127.78.1.0/24")


def resolve_target(args):
    """The cluster and subnet the demo acts on: --cluster/--subnet, else $DT_DEMO_CLUSTER, else the
    inventory's cluster for MXNet and TORCH_DEMO's for torch."""
    default_cluster, default_subnet = TORCH_DEMO if args.engine == "torch" else (_local_cluster_name(), "")
    args.cluster = args.cluster or os.environ.get("DT_DEMO_CLUSTER") or default_cluster
    if not args.subnet and args.cluster == default_cluster:
        args.subnet = default_subnet
    return args


def _local_cluster_name():
    """dt_cluster_name of the local inventory (its one home): the cluster the playbooks act on without -e."""
    import yaml
    with open(os.path.join(ROOT, "inventories", "local", "group_vars", "all", "dynatrain.yml"), encoding="utf-8") as fh:
        return yaml.safe_load(fh)["dt_cluster_name"]


def read_lines_since(path, offset):
    """The complete lines of ``path`` from byte ``offset`` on, and the offset after them.

    A last line without its newline is left for the next call; a file that
    shrank below ``offset`` (replaced, e.g. archived by train.yml) is read from 0.
    """
    try:
        with open(path, "rb") as fh:
            if fh.seek(0, os.SEEK_END) < offset:
                offset = 0
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return [], offset
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    return data[:end].decode("utf-8", "replace").split("\n"), offset + end + 1


def epoch_line(event):
    """One line for an ``epoch`` event of events.jsonl (epochs counted from 1)."""
    acc = event.get("val_acc")
    acc_text = "%.2f%%" % (100.0 * float(acc)) if acc is not None else "-"
    return ("    epoch %3d  step %5s  world %s  %8.1f samples/s  val acc %s"
            % (int(event.get("epoch", 0)) + 1, event.get("step", "?"), event.get("world", "?"),
               float(event.get("samples_per_s") or 0.0), acc_text))


def membership_line(entry):
    """One line for a host_worker_log entry ``(seq, event, ip, ns, line)``."""
    seq, event, ip, _ns, _line = entry
    return "    membership: %-7s %s  (host_worker_log #%d)" % (event, ip, seq)


class Follower(threading.Thread):
    """Prints the job's epochs and membership changes as they appear on the shared volume."""

    def __init__(self, efs_dir, say, interval=1.0):
        super().__init__(daemon=True)
        self.efs_dir = efs_dir
        self.say = say
        self.interval = interval
        self.stopped = threading.Event()
        self.events_offset = 0
        self.log_offset = 0

    def poll(self):
        """Print what was appended since the last poll."""
        lines, self.events_offset = read_lines_since(os.path.join(self.efs_dir, "events.jsonl"),
                                                     self.events_offset)
        for event in parse_events("\n".join(lines))[0]:
            if event.get("event") == "epoch":
                self.say(epoch_line(event))
        entries, self.log_offset, _bad = read_log_since(os.path.join(self.efs_dir, "host_worker_log"),
                                                        self.log_offset)
        for entry in entries:
            self.say(membership_line(entry))

    def run(self):
        while not self.stopped.is_set():
            self.poll()
            self.stopped.wait(self.interval)

    def stop(self):
        self.stopped.set()
        self.join(timeout=5)
        self.poll()


def localcloud_env():
    """The environment the playbooks need to talk to the local cloud."""
    out = subprocess.run([PY, "-m", "localcloud", "env"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    env = dict(os.environ)
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("export ") and "=" in line:
            key, value = line[len("export "):].split("=", 1)
            env[key] = shlex.split(value)[0] if value else ""
    env["ANSIBLE_CONFIG"] = os.path.join(ROOT, "ansible.cfg")
    env["ANSIBLE_FORCE_COLOR"] = "0"
    env["PATH"] = os.path.dirname(PY) + os.pathsep + env.get("PATH", "")
    return env


class Demo:
    def __init__(self, args):
        self.args = args
        self.phases = []  # (name, seconds)
        self.logdir = os.path.join(ROOT, ".localcloud", "demo")
        os.makedirs(self.logdir, exist_ok=True)
        self.env = None
        self.follower = None
        self.print_lock = threading.Lock()

    def say(self, msg):
        if not self.args.json:
            with self.print_lock:
                print(msg, flush=True)

    def phase(self, name, func, *a, **kw):
        self.say("==> %s" % name)
        t0 = time.monotonic()
        result = func(*a, **kw)
        dt = time.monotonic() - t0
        self.phases.append((name, round(dt, 1)))
        self.say("    done in %.1f s" % dt)
        return result

    def extra_vars(self):
        ev = {"dt_cluster_name": self.args.cluster}
        if getattr(self.args, "engine", "mxnet") != "mxnet":
            # the cluster's engine; add_workers/remove_workers would take it from the job anyway
            ev["dt_engine"] = self.args.engine
        if self.args.subnet:
            ev["dt_subnet_cidr"] = self.args.subnet
            ev["dt_vpc_cidr"] = self.args.subnet.rsplit(".", 2)[0] + ".0.0/16"
        ev["dt_train_script_args"] = self.args.train_args
        return ev

    def playbook(self, name, extra=None, check=True):
        log = os.path.join(self.logdir, "%s-%s.log" % (self.args.cluster, name))
        ev = self.extra_vars()
        ev.update(extra or {})
        cmd = [os.path.join(os.path.dirname(PY), "ansible-playbook"),
               os.path.join(ROOT, "playbooks", name + ".yml"), "-e", json.dumps(ev)]
        if self.args.json:
            with open(log, "w") as fh:
                proc = subprocess.run(cmd, cwd=ROOT, env=self.env, stdout=fh, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, check=False)
        else:
            proc = self.playbook_with_progress(cmd, log)
        if check and proc.returncode != 0:
            with open(log) as fh:
                tail = fh.read()[-4000:]
            raise DemoError("playbook %s failed (rc=%d); log %s:\n%s" % (name, proc.returncode, log, tail))
        return proc.returncode, log

    def playbook_with_progress(self, cmd, log):
        """Run the playbook with the compact progress callback on our stdout, its full output into ``log``."""
        env = dict(self.env, ANSIBLE_STDOUT_CALLBACK="dynatrain.elastic.progress", DT_PROGRESS_LOG=log)
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, bufsize=1)
        for line in proc.stdout:
            self.say("  " + line.rstrip("\n"))
        proc.wait()
        return proc

    def follow_job(self):
        """Start printing epochs and membership changes (from the shared volume) while we go on."""
        if not self.args.json and self.follower is None:
            self.follower = Follower(self.efs_dir(), self.say)
            self.follower.start()

    def stop_following(self):
        if self.follower is not None:
            self.follower.stop()
            self.follower = None

    def train_to_end(self):
        """Wait for the final result; the last epoch lines are printed before this phase ends."""
        try:
            return self.wait_for("the final result", self.final, self.args.timeout)
        finally:
            self.stop_following()

    # --- reading the cluster ---------------------------------------------
    def boto(self, service):
        import boto3
        return boto3.client(service, endpoint_url=self.env["AWS_ENDPOINT_URL"],
                            region_name=self.env.get("AWS_DEFAULT_REGION", "us-east-1"),
                            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"])

    def efs_dir(self):
        fss = self.boto("efs").describe_file_systems()["FileSystems"]
        for fs in fss:
            if fs.get("CreationToken") == "%s-efs" % self.args.cluster:
                home = self.env.get("DT_LOCALCLOUD_HOME", os.path.join(ROOT, ".localcloud"))
                return os.path.join(home, "efs", fs["FileSystemId"])
        raise DemoError("no EFS named %s-efs" % self.args.cluster)

    def instances(self):
        res = self.boto("ec2").describe_instances(Filters=[
            {"Name": "tag:dynatrain:cluster", "Values": [self.args.cluster]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]}])
        out = []
        for r in res["Reservations"]:
            for i in r["Instances"]:
                tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
                out.append({"id": i["InstanceId"], "ip": i["PrivateIpAddress"],
                            "role": tags.get("dynatrain:role"), "status": tags.get("elastic_worker_status", "")})
        return sorted(out, key=lambda x: (x["role"] != "master", x["ip"]))

    def read(self, rel, default=""):
        try:
            with open(os.path.join(self.efs_dir(), rel)) as fh:
                return fh.read()
        except OSError:
            return default

    def status(self):
        """status.json as a dict ({} while missing or being replaced)."""
        try:
            return parse_status(self.read("status.json"))
        except JobStatusError:
            return {}

    def hosts(self):
        """host_worker's addresses, the master last."""
        try:
            return parse_hosts(self.read("host_worker"))
        except HostWorkerError as exc:
            raise DemoError(str(exc)) from None

    def wait_for(self, what, predicate, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(1)
        raise DemoError("timed out after %d s waiting for %s; launcher log tail:\n%s"
                        % (timeout, what, self.read("logs/launcher.log")[-3000:]))

    def events(self):
        """events.jsonl as a list of dicts (a line still being written is skipped)."""
        return parse_events(self.read("events.jsonl"))[0]

    def final(self):
        try:
            return json.loads(self.read("results/final.json", "") or "null")
        except ValueError:
            return None

    # --- the demo ----------------------------------------------------------
    def run(self):
        t_start = time.monotonic()
        self.phase("start the local cloud", subprocess.run, [PY, "-m", "localcloud", "up"], cwd=ROOT, check=True)
        self.env = localcloud_env()
        self.phase("bootstrap master + %d worker(s) (playbooks/bootstrap.yml)" % self.args.workers,
                   self.playbook, "bootstrap", {"worker_count": self.args.workers})
        if self.status().get("state") == "finished":
            # a cluster from an earlier demo: bootstrap changed nothing; train anew
            self.phase("archive the finished job and train a fresh one (playbooks/train.yml)",
                       self.playbook, "train", {"train_fresh": True})
        self.follow_job()
        if self.args.elastic:
            hold = self.args.hold_epochs
            world = self.phase("train %d epochs at the first world size" % hold, self.hold, hold, 600)
            self.phase("add %d worker(s) while training (playbooks/add_workers.yml)" % self.args.add,
                       self.playbook, "add_workers", {"count": self.args.add})
            if world:
                self.phase("train %d epochs at world %d" % (hold, world + self.args.add),
                           self.hold, hold, 300, world + self.args.add)
            self.phase("remove 1 worker while training (playbooks/remove_workers.yml)",
                       self.playbook, "remove_workers", {"count": 1})
        result = self.phase("train to the end", self.train_to_end)
        generations = [e for e in self.events() if e.get("event") == "generation_start"]
        summary = {
            "cluster": self.args.cluster,
            "generations": [{"generation": g["generation"], "membership": g["membership"],
                             "resume_step": g.get("resume_step")} for g in generations],
            "nodes": self.instances(),
            "final": result,
            "host_worker": self.hosts(),
            "host_worker_log": self.read("host_worker_log").splitlines(),
            "phases": self.phases,
            "total_s": round(time.monotonic() - t_start, 1),
            "efs_dir": self.efs_dir(),
            "timeline": self.plot_timeline(),
            "throughput": world_segments(self.events()),
            "hold_epochs": self.args.hold_epochs if self.args.elastic else 0,
            "engine": self.args.engine,
        }
        return summary

    def hold(self, epochs, timeout, world=None):
        """Wait until the job has trained ``epochs`` counted epochs at its current world size (``world``
        when given: the add's epochs at the old size do not count); that world size, or 0 when the job
        ended first."""
        def reached():
            now, counted = current_stretch(self.events())
            if now and (world is None or now == world) and counted >= epochs:
                return now
            return -1 if self.final() else None   # -1: the job ended first (truthy, so the wait ends)

        return max(self.wait_for("%d epochs at world %s" % (epochs, world or "as it is"), reached, timeout), 0)

    def plot_timeline(self):
        """The run's timeline as a PNG (the same picture as `status.yml -e plot=true`); its path, or
        why there is none."""
        from ansible_collections.dynatrain.elastic.plugins.module_utils.timeline_plot import (
            TimelinePlotError, render)

        path = os.path.join(self.logdir, "%s-timeline.png" % self.args.cluster)
        try:
            render(self.events(), path, title="dynatrain.elastic demo, cluster %s" % self.args.cluster)
        except TimelinePlotError as exc:
            return "no picture: %s" % exc
        return path


def throughput_by_world(events):
    """``[[world, mean samples/s, epochs], ...]`` from the ``epoch`` events, one row per world size (the
    stretches of ``world_segments`` at that size pooled): what a resize did to throughput."""
    by_world = {}
    for world, rates in _stretches(events):
        by_world.setdefault(world, []).extend(rates)
    return [[w, round(sum(v) / len(v), 1), len(v)] for w, v in sorted(by_world.items()) if v]


def world_segments(events):
    """``[[world, mean samples/s or None, epochs], ...]`` in time order, one row per stretch of epochs at one
    world size (world 2 -> 3 -> 2 after an add and a removal): the demo's samples/s table."""
    return [[w, round(sum(v) / len(v), 1) if v else None, len(v)] for w, v in _stretches(events)]


def current_stretch(events):
    """``(world, counted epochs)`` of the last stretch (``(None, 0)`` before the first epoch): how long
    the job has trained at the world size it has now."""
    stretches = _stretches(events)
    return (stretches[-1][0], len(stretches[-1][1])) if stretches else (None, 0)


def _stretches(events):
    """``[(world, [samples/s of each counted epoch]), ...]`` in time order. An epoch whose world differs
    from the epoch before starts a stretch; the first epoch of a stretch, and of each generation (a restart
    at the same size), is not counted: it still ran partly in the group before (the job's very first epoch:
    its start-up). A counted epoch's rate is its own: the epoch's samples over the time since the epoch
    before it (the launcher's samples_per_s is a moving window of steps, which would carry the size before
    into the next epochs too); events without those fields give samples_per_s."""
    out, last = [], None
    for e in events:
        if e.get("event") != "epoch" or not e.get("world"):
            continue
        world = int(e["world"])
        if last is None or world != int(last["world"]):
            out.append((world, []))
        elif e.get("generation") == last.get("generation"):
            rate = _epoch_rate(e, last)
            if rate:
                out[-1][1].append(rate)
        last = e
    return out


def _epoch_rate(event, before):
    """samples/s of the epoch ``event`` ended, ``before`` being the epoch event before it."""
    try:
        elapsed = float(event["time"]) - float(before["time"])
        if elapsed > 0 and float(event["samples"]) > 0:
            return float(event["samples"]) / elapsed
    except (KeyError, TypeError, ValueError):
        pass
    return float(event.get("samples_per_s") or 0.0)


def throughput_lines(segments, hold=0):
    """The summary's samples/s table: one line per stretch of one world size, in time order, and a warning
    for a stretch shorter than ``hold`` epochs (its figure rests on too little to show a level)."""
    if not segments:
        return []
    lines = ["  samples/s per world size, in time order (%s; simulated compute per sample on this machine's cores):"
             % " -> ".join(str(w) for w, _rate, _n in segments)]
    for world, rate, epochs in segments:
        rate_text = "%8.1f samples/s" % rate if rate is not None else "%8s samples/s" % "-"
        lines.append("    world %d: %s  (%d epoch%s)" % (world, rate_text, epochs, "" if epochs == 1 else "s"))
    short = [w for w, _rate, n in segments if n < hold]
    if short:
        lines.append("    (world %s ran fewer than %d epochs: its figure is not yet a level; more --train-args "
                     "epochs or --hold-epochs)" % (", ".join(str(w) for w in short), hold))
    return lines


def print_summary(s):
    f = s["final"] or {}
    print()
    print("=" * 72)
    print("dynatrain.elastic demo — cluster %s (engine %s)" % (s["cluster"], s.get("engine", "mxnet")))
    print("  nodes:")
    for n in s["nodes"]:
        print("    %-8s %-20s %-15s %s" % (n["role"], n["id"], n["ip"], n["status"]))
    print("  training: %s epochs, %s steps, validation accuracy %.2f%%, world size at the end %s"
          % (f.get("epochs"), f.get("steps"), 100.0 * float(f.get("val_acc", 0)), f.get("world_at_end")))
    print("  process groups (a new one per membership change):")
    for g in s["generations"]:
        print("    generation %s from step %s: %s" % (g["generation"], g["resume_step"], ", ".join(g["membership"])))
    print("  host_worker_log:")
    for line in s["host_worker_log"]:
        print("    " + line)
    print("  wall time per phase:")
    for name, secs in s["phases"]:
        print("    %7.1f s  %s" % (secs, name))
    print("    %7.1f s  total" % s["total_s"])
    print("  shared volume on this machine: %s" % s["efs_dir"])
    for line in throughput_lines(s.get("throughput") or [], s.get("hold_epochs", 0)):
        print(line)
    print("  timeline (world size, samples/s, accuracy; resizes marked): %s" % s["timeline"])
    print()
    cluster = "" if s["cluster"] == _local_cluster_name() else " -e dt_cluster_name=%s" % s["cluster"]
    print("The cluster is still up. At the repository root (make setup put ansible-playbook on the PATH), try:")
    print("  ansible-playbook status.yml%s" % cluster)
    print("  ansible-playbook add_workers.yml -e count=2%s    # the job has finished: they join the next run" % cluster)
    print("  ansible-playbook train.yml -e train_fresh=true%s    # a new job on the cluster as it is now" % cluster)
    print("Remove it with: ansible-playbook teardown.yml%s, or make demo-down (the whole local cloud)" % cluster)
    print("=" * 72)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", default="mxnet", choices=ENGINES,
                   help="the cluster's dt_engine (make demo ENGINE=torch) [%%(default)s]; torch runs on a cluster of its own "
                        "(%s, subnet %s) so the MXNet demo's cluster stays as it is" % TORCH_DEMO)
    p.add_argument("--cluster", default="", help="the cluster [$DT_DEMO_CLUSTER, else the inventory's "
                                                 "dt_cluster_name; for torch %s]" % TORCH_DEMO[0])
    p.add_argument("--workers", type=int, default=1, help="base workers besides the master")
    p.add_argument("--subnet", default="", help="subnet CIDR (default: the inventory's; for torch %s)" % TORCH_DEMO[1])
    p.add_argument("--hold-epochs", type=int, default=5,
                   help="epochs each world size trains before the next change (the add, then the removal), "
                        "as the samples/s table counts them [%(default)s]")
    p.add_argument("--elastic", action=argparse.BooleanOptionalAction, default=True,
                   help="add and remove workers while training")
    p.add_argument("--add", type=int, default=1, help="workers to add while training")
    p.add_argument("--timeout", type=int, default=900, help="seconds to wait for training to finish")
    p.add_argument("--train-args", default="--epochs 60 --sample-cost-ms 6",
                   help="arguments of the training script (dt-train-digits); --sample-cost-ms stands in "
                        "for a heavier model (ms per sample a worker processes, simulated compute), so the "
                        "resizes land mid-run and a joining worker raises samples/s")
    p.add_argument("--json", action="store_true", help="print the summary as JSON only")
    args = p.parse_args(argv)
    args.train_args = shlex.split(args.train_args)
    resolve_target(args)
    try:
        summary = Demo(args).run()
    except (DemoError, subprocess.CalledProcessError) as exc:
        print("demo failed: %s" % exc, file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary))
    else:
        print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
