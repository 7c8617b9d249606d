#!/usr/bin/env python3
"""`make demo`: the product end to end on the embedded local cloud.

Starts the local cloud, bootstraps a master + base workers with the real
playbooks, trains the digits example with MXNet's parameter server across the
nodes, (with --elastic) adds and removes workers while it trains, and prints
what happened: nodes, epochs, accuracy, membership log, wall time per phase.
The cluster is left up; `make demo-down` removes it.

Also used by the end-to-end test (`--json` prints the summary as JSON).
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable

# The collection's readers of the shared volume's files (`make collection` links
# .collections/ansible_collections/dynatrain/elastic to this checkout).
sys.path.insert(0, os.path.join(ROOT, ".collections"))
from ansible_collections.dynatrain.elastic.plugins.module_utils.host_worker_file import (  # noqa: E402
    HostWorkerError, parse_hosts)
from ansible_collections.dynatrain.elastic.plugins.module_utils.job_status import (  # noqa: E402
    JobStatusError, parse_status)


class DemoError(RuntimeError):
    pass


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

    def say(self, msg):
        if not self.args.json:
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
        with open(log, "w") as fh:
            proc = subprocess.run(cmd, cwd=ROOT, env=self.env, stdout=fh, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, check=False)
        if check and proc.returncode != 0:
            with open(log) as fh:
                tail = fh.read()[-4000:]
            raise DemoError("playbook %s failed (rc=%d); log %s:\n%s" % (name, proc.returncode, log, tail))
        return proc.returncode, log

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
        out = []
        for line in self.read("events.jsonl").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

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
        if self.args.elastic:
            self.phase("wait for training to run", self.wait_for, "the first epoch",
                       lambda: self.status().get("epoch", 0) >= 1 or self.final(), 300)
            self.phase("add %d worker(s) while training (playbooks/add_workers.yml)" % self.args.add,
                       self.playbook, "add_workers", {"count": self.args.add})
            self.phase("remove 1 worker while training (playbooks/remove_workers.yml)",
                       self.playbook, "remove_workers", {"count": 1})
        result = self.phase("train to the end", self.wait_for, "the final result", self.final, self.args.timeout)
        generations = [json.loads(l) for l in self.read("events.jsonl").splitlines()
                       if '"generation_start"' in l]
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
        }
        return summary


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
    print()
    print("The cluster is still up. Try:")
    print("  eval \"$(.venv/bin/python -m localcloud env)\"")
    print("  .venv/bin/ansible-playbook playbooks/status.yml -e dt_cluster_name=%s" % s["cluster"])
    print("  .venv/bin/ansible-playbook playbooks/add_workers.yml -e count=2 -e dt_cluster_name=%s" % s["cluster"])
    print("Remove it with: make demo-down  (or playbooks/teardown.yml, then python -m localcloud down)")
    print("=" * 72)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cluster", default=os.environ.get("DT_DEMO_CLUSTER", "dtdemo"))
    p.add_argument("--workers", type=int, default=1, help="base workers besides the master")
    p.add_argument("--subnet", default="", help="subnet CIDR (default: the inventory's)")
    p.add_argument("--elastic", action=argparse.BooleanOptionalAction, default=True,
                   help="add and remove workers while training")
    p.add_argument("--add", type=int, default=1, help="workers to add while training")
    p.add_argument("--timeout", type=int, default=900, help="seconds to wait for training to finish")
    p.add_argument("--train-args", default="--epochs 60 --step-sleep 0.25",
                   help="arguments of the training script (dt-train-digits); the step sleep "
                        "stands in for a heavier model so that the resizes land mid-run")
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
