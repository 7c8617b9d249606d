#!/usr/bin/env python3
"""`make demo`: the product end to end on the embedded local cloud.

Starts the local cloud, bootstraps a master + base workers with the real
playbooks, trains the digits example with MXNet's parameter server across the
nodes, (with --elastic) adds and removes workers while it trains, and prints
what happened: nodes, epochs, accuracy, membership log, wall time per phase.
The cluster is left up; `make demo-down` removes it.

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
            self.phase("wait for training to run", self.wait_for, "the first epoch",
                       lambda: self.status().get("epoch", 0) >= 1 or self.final(), 300)
            self.phase("add %d worker(s) while training (playbooks/add_workers.yml)" % self.args.add,
                       self.playbook, "add_workers", {"count": self.args.add})
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
            "throughput": throughput_by_world(self.events()),
        }
        return summary

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
    """``[[world, mean samples/s, epochs], ...]`` from the ``epoch`` events: what a resize did to throughput.
    The first epoch of each generation is left out: its rate still counts steps of the world before."""
    by_world, seen = {}, set()
    for e in events:
        if e.get("event") != "epoch" or not e.get("world") or not e.get("samples_per_s"):
            continue
        if e.get("generation") not in seen:
            seen.add(e.get("generation"))
            continue
        by_world.setdefault(int(e["world"]), []).append(float(e["samples_per_s"]))
    return [[w, round(sum(v) / len(v), 1), len(v)] for w, v in sorted(by_world.items())]


def print_summary(s):
    f = s["final"] or {}
    print()
    print("=" * 72)
    print("dynatrain.elastic demo — cluster %s" % s["cluster"])
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
    if s.get("throughput"):
        print("  samples/s by world size (simulated compute per sample on this machine's 2 cores):")
        for world, rate, epochs in s["throughput"]:
            print("    world %d: %8.1f samples/s  (%d epoch%s)" % (world, rate, epochs, "" if epochs == 1 else "s"))
    print("  timeline (world size, samples/s, accuracy; resizes marked): %s" % s["timeline"])
    print()
    cluster = "" if s["cluster"] == _local_cluster_name() else " -e dt_cluster_name=%s" % s["cluster"]
    print("The cluster is still up. At the repository root, try:")
    print("  source .venv/bin/activate")
    print("  ansible-playbook status.yml%s" % cluster)
    print("  ansible-playbook add_workers.yml -e count=2%s    # the job has finished: they join the next run" % cluster)
    print("  ansible-playbook train.yml -e train_fresh=true%s    # a new job on the cluster as it is now" % cluster)
    print("Remove it with: ansible-playbook teardown.yml%s, or make demo-down (the whole local cloud)" % cluster)
    print("=" * 72)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cluster", default=os.environ.get("DT_DEMO_CLUSTER") or _local_cluster_name())
    p.add_argument("--workers", type=int, default=1, help="base workers besides the master")
    p.add_argument("--subnet", default="", help="subnet CIDR (default: the inventory's)")
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
