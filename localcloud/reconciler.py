"""Make the data plane follow the control plane, once a second.

moto only keeps records; this loop turns every pending/running EC2 instance
into a podman container (its "machine"), serves its IMDS, gives it the EFS
file systems of its VPC, and removes containers whose instance terminated or
vanished.

A stopped instance keeps its machine, as an EBS-backed EC2 instance keeps its
root volume: StopInstances -> `halt` (`podman stop`, the container kept, its
IMDS gone), then moto_compat.settle() moves the instance from `stopping` to
`stopped`; StartInstances -> `resume` (`podman start` of the same container:
same disk, same host keys), `pending` until its sshd answers, then `running`.

`plan()` is the decision, a pure function of what moto says and what podman
has, so it is unit-tested without either. `Reconciler` gathers the inputs,
runs `plan()` and carries the actions out.

A container that dies on its own (a test's `podman kill`, an OOM) is a lost
node: its instance stays "running" in EC2, exactly like a hung machine, and
we never re-create or restart it. Only containers we stopped ourselves
(`halted`: the instance was stopped) are started again, when their instance
is; a lost node whose instance is stopped is halted like any other (the EC2
remedy for an impaired instance: stop and start it).
"""

import ipaddress
import logging
import os
import shutil
import socket
import threading
import time
from collections import namedtuple

from . import baked_images, config, moto_compat, podman
from .imds import ImdsRegistry, InstanceMetadata

log = logging.getLogger("localcloud.reconciler")

LIVE_STATES = ("pending", "running")
HALT_STATES = ("stopping", "stopped")  # the machine is off, its disk kept
SSH_WAIT_S = 30  # bound on "container created -> sshd answers"
MAX_CREATE_ATTEMPTS = 3  # also bounds the tries to start a halted container
# What EC2 gives the OS to shut down on StopInstances before it pulls the plug (systemd
# in the node stops its services on SIGRTMIN+3); podman kills it after that.
STOP_TIMEOUT_S = 30

Instance = namedtuple(
    "Instance",
    "id state private_ip region vpc_id key_name public_key instance_type az ami_id tags launch_time iam_role lifecycle"
    " public_ip",
)
Instance.__new__.__defaults__ = (None,) * 14  # only id is required (tests build partial ones)

Action = namedtuple("Action", "kind instance_id reason")
# kind: create | remove | lost | adopt | skip | mount | halt (stop, keep) | resume (start it again)


def is_loopback(ip):
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def wants_node(inst):
    return inst.state in LIVE_STATES and bool(inst.private_ip) and is_loopback(inst.private_ip)


def keeps_node(inst):
    """A container for it is kept: running (pending/running) or stopped with its disk (stopping/stopped)."""
    return inst.state in LIVE_STATES + HALT_STATES and bool(inst.private_ip) and is_loopback(inst.private_ip)


def plan(instances, containers, created, busy, halted=frozenset()):
    """Decide what to do. Pure.

    instances: [Instance] from every region; containers: {name: podman state}
    of this cloud; created: ids whose container we made and still own;
    busy: ids a thread is working on right now (create, halt, resume);
    halted: ids whose container we stopped because their instance was stopped.
    """
    actions = []
    by_id = {i.id: i for i in instances}
    kept = {i.id for i in instances if keeps_node(i)}
    for name in sorted(containers):
        if name in kept or name in busy:
            continue
        inst = by_id.get(name)
        why = "instance %s" % inst.state if inst else "no such instance"
        actions.append(Action("remove", name, why))
    for inst in sorted(instances, key=lambda i: i.id):
        if inst.id in busy:
            continue
        state = containers.get(inst.id)
        if inst.state in HALT_STATES:
            # `stopping` until the container stopped (halt settles it `stopped`); a
            # container found running while stopped (started by hand) is halted again.
            # An API-only instance (no container) is halted too: it must reach `stopped`.
            if inst.state == "stopping" or state == "running":
                actions.append(Action("halt", inst.id, "instance %s" % inst.state))
            continue
        if inst.state not in LIVE_STATES:
            continue
        if not wants_node(inst):
            # Default-VPC instances (172.31.x) can't be bound on this machine:
            # they exist in the API only. The local VPC is 127.77.0.0/16.
            actions.append(Action("skip", inst.id, "private IP %s is not a loopback address" % inst.private_ip))
            continue
        if state is None:
            if inst.id in created and inst.id not in halted:
                actions.append(Action("lost", inst.id, "container gone"))
            else:
                # New, or its stopped container was removed (by hand): a new machine.
                actions.append(Action("create", inst.id, "instance %s" % inst.state))
        elif inst.id in halted:
            # Started again after we stopped it: the same container, disk and host keys.
            actions.append(Action("resume", inst.id, "instance %s, container %s" % (inst.state, state)))
        elif inst.id not in created:
            # Ours (same state dir) but made before we started, e.g. after a
            # daemon restart: adopt it rather than replace a working node.
            actions.append(Action("adopt", inst.id, "container %s" % state))
        elif state != "running":
            # Died on its own (we did not halt it): a lost node, never restarted.
            actions.append(Action("lost", inst.id, "container %s" % state))
    return actions


def efs_for(inst, fs_vpcs):
    """EFS file systems reachable from the instance: a mount target in its VPC."""
    return sorted(fs for fs, vpcs in fs_vpcs.items() if inst.vpc_id and inst.vpc_id in vpcs)


def plan_mounts(instances, containers, created, mounted, fs_vpcs):
    """Mount targets created after a node started: mount them into it now."""
    actions = []
    for inst in instances:
        if inst.id in created and containers.get(inst.id) == "running":
            for fs in efs_for(inst, fs_vpcs):
                if fs not in mounted.get(inst.id, ()):
                    actions.append(Action("mount", inst.id, fs))
    return actions


def short_hostname(ip):
    return "ip-" + ip.replace(".", "-")


def wait_ssh(ip, timeout=SSH_WAIT_S):
    """Wait until sshd on ip:22 sends its banner. True when it did."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((ip, 22), timeout=2) as s:
                s.settimeout(2)
                if s.recv(4).startswith(b"SSH-"):
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


class Reconciler:
    """Holds what the daemon knows between ticks and executes plans."""

    def __init__(self, clients, regions, home=None):
        self.clients = clients  # clients(service, region) -> boto3 client
        self.regions = regions  # regions() -> region names with EC2 state
        self.home = home or config.home()
        self.imds = ImdsRegistry()
        self.lock = threading.Lock()
        self.created = set()
        self.busy = set()  # a create/halt/resume thread is on it
        self.halted = set()  # we stopped its container because its instance was stopped
        self.lost = {}  # id -> reason (logged once)
        self.skipped = set()
        self.attempts = {}
        self.mounted = {}  # id -> set of fs ids visible in the container
        self.volumes = {}  # id -> fs ids given at creation (-v): podman mounts them at every start
        self.known_fs = set()
        self.terminations = {}  # id -> (region, unix time)
        self.threads = []
        self.last = {"instances": [], "containers": {}, "fs_vpcs": {}, "at": None}
        self.imds_failed = set()

    # -- gather ---------------------------------------------------------
    def gather(self):
        instances, fs_vpcs = [], {}
        for region in self.regions():
            ec2 = self.clients("ec2", region)
            keys = {
                k["KeyName"]: k.get("PublicKey")
                for k in ec2.describe_key_pairs(IncludePublicKey=True).get("KeyPairs", [])
            }
            for page in ec2.get_paginator("describe_instances").paginate():
                for res in page.get("Reservations", []):
                    for i in res.get("Instances", []):
                        instances.append(
                            Instance(
                                id=i["InstanceId"],
                                state=i["State"]["Name"],
                                private_ip=i.get("PrivateIpAddress"),
                                region=region,
                                vpc_id=i.get("VpcId"),
                                key_name=i.get("KeyName"),
                                public_key=keys.get(i.get("KeyName")),
                                instance_type=i.get("InstanceType"),
                                az=(i.get("Placement") or {}).get("AvailabilityZone"),
                                ami_id=i.get("ImageId"),
                                tags={t["Key"]: t.get("Value", "") for t in i.get("Tags") or []},
                                launch_time=str(i.get("LaunchTime", "")),
                                iam_role=(i.get("IamInstanceProfile") or {}).get("Arn"),
                                lifecycle=i.get("InstanceLifecycle") or "on-demand",
                                # From the loopback public pool (moto_compat), when the
                                # subnet/template gives one; None otherwise, as on EC2.
                                public_ip=i.get("PublicIpAddress") or None,
                            )
                        )
            efs = self.clients("efs", region)
            for fs in efs.describe_file_systems().get("FileSystems", []):
                fs_id = fs["FileSystemId"]
                mts = efs.describe_mount_targets(FileSystemId=fs_id).get("MountTargets", [])
                fs_vpcs[fs_id] = {mt.get("VpcId") for mt in mts if mt.get("VpcId")}
        containers = podman.list_containers(self.home)
        return instances, containers, fs_vpcs

    # -- act ------------------------------------------------------------
    def tick(self):
        instances, containers, fs_vpcs = self.gather()
        self._sync_efs_dirs(fs_vpcs)
        with self.lock:
            actions = plan(instances, containers, set(self.created), set(self.busy), set(self.halted))
            actions += plan_mounts(instances, containers, self.created, self.mounted, fs_vpcs)
            self.last = {"instances": instances, "containers": containers, "fs_vpcs": fs_vpcs, "at": time.time()}
        by_id = {i.id: i for i in instances}
        for a in actions:
            getattr(self, "_do_" + a.kind)(a, by_id.get(a.instance_id), fs_vpcs)
        self._sync_imds(instances)
        self._terminate_due()
        self.threads = [t for t in self.threads if t.is_alive()]
        return actions

    def _do_skip(self, a, inst, fs_vpcs):
        if a.instance_id not in self.skipped:
            self.skipped.add(a.instance_id)
            log.warning("%s: no node: %s (launch it in a 127.x subnet)", a.instance_id, a.reason)
        # Started again (StartInstances): no machine to wait for.
        moto_compat.settle(a.instance_id, "pending", "running")

    def _do_adopt(self, a, inst, fs_vpcs):
        log.info("%s: adopting existing container (%s)", a.instance_id, a.reason)
        with self.lock:
            self.created.add(a.instance_id)
            self.mounted.setdefault(a.instance_id, set())

    def _do_lost(self, a, inst, fs_vpcs):
        if a.instance_id not in self.lost:
            self.lost[a.instance_id] = a.reason
            log.warning("%s: node lost (%s); instance left as is, container not re-created", a.instance_id, a.reason)
        # EC2's status checks of a dead machine fail (DescribeInstanceStatus: impaired)
        moto_compat.set_impaired(a.instance_id, a.reason)

    def _do_remove(self, a, inst, fs_vpcs):
        log.info("%s: removing container (%s)", a.instance_id, a.reason)
        podman.remove(a.instance_id)
        with self.lock:
            self.created.discard(a.instance_id)
            self.halted.discard(a.instance_id)
            self.lost.pop(a.instance_id, None)
            self.mounted.pop(a.instance_id, None)
            self.volumes.pop(a.instance_id, None)
            self.attempts.pop(a.instance_id, None)
        moto_compat.set_impaired(a.instance_id, None)
        shutil.rmtree(config.instance_dir(a.instance_id), ignore_errors=True)

    def _start_thread(self, kind, target, *args):
        # One thread per node: a bootstrap launches several at once and each
        # takes a second or two until sshd answers (a stop: until systemd shut down).
        with self.lock:
            self.busy.add(args[0].id)
        t = threading.Thread(target=target, args=args, name="%s-%s" % (kind, args[0].id), daemon=True)
        self.threads.append(t)
        t.start()

    def _do_create(self, a, inst, fs_vpcs):
        n = self.attempts.get(inst.id, 0)
        if n >= MAX_CREATE_ATTEMPTS:
            return
        self.attempts[inst.id] = n + 1
        self._start_thread("create", self._create, inst, efs_for(inst, fs_vpcs))

    def _write_instance_files(self, inst):
        """What localcloud-init reads at each boot (the instance dir, mounted read-only)."""
        idir = config.instance_dir(inst.id)
        os.makedirs(idir, exist_ok=True)
        with open(os.path.join(idir, "authorized_keys"), "w") as f:
            f.write((inst.public_key or "").strip() + "\n")
        # Read by localcloud-init.service (systemd gives services a clean environment).
        # Written again before a stopped node starts: EC2 gives it a new public IP.
        with open(os.path.join(idir, "instance.env"), "w") as f:
            f.write(
                "LOCALCLOUD_PRIVATE_IP=%s\nLOCALCLOUD_PUBLIC_IP=%s\nLOCALCLOUD_INSTANCE_ID=%s\n"
                "LOCALCLOUD_HOSTNAME=%s\n"
                % (inst.private_ip, inst.public_ip or "", inst.id, short_hostname(inst.private_ip))
            )
        return idir

    def _await_sshd(self, inst, start, what, fs_ids=()):
        """Log how long the node took until its sshd answered (or that it did not)."""
        if wait_ssh(inst.private_ip):
            log.info(
                "%s: node %s, sshd on %s:22 after %.1f s (efs: %s)",
                inst.id,
                what,
                ", ".join(filter(None, (inst.private_ip, inst.public_ip))),
                time.monotonic() - start,
                ",".join(fs_ids) or "-",
            )
            # sshd binds both addresses at once; say so if the public one failed
            # (e.g. taken by a node of another local cloud).
            if inst.public_ip and not wait_ssh(inst.public_ip, timeout=5):
                log.warning("%s: sshd silent on its public address %s:22", inst.id, inst.public_ip)
        else:
            log.warning(
                "%s: container started but sshd on %s:22 silent after %d s", inst.id, inst.private_ip, SSH_WAIT_S
            )

    def _create(self, inst, fs_ids):
        start = time.monotonic()
        try:
            idir = self._write_instance_files(inst)
            os.makedirs(config.efs_dir(), exist_ok=True)
            args = [
                "run",
                "-d",
                "--name",
                inst.id,
                "--label",
                "%s=1" % config.LABEL,
                "--label",
                "%s=%s" % (config.HOME_LABEL, self.home),
                "--label",
                "dynatrain.localcloud.private-ip=%s" % inst.private_ip,
                "--label",
                "dynatrain.localcloud.public-ip=%s" % (inst.public_ip or ""),
                "--network",
                "host",
                "--privileged",
                # systemd is PID 1, as on an EC2 instance (the image's CMD is /sbin/init).
                "--systemd=always",
                "--hostname",
                short_hostname(inst.private_ip),
                "-v",
                "%s:%s:ro" % (idir, config.INSTANCE_MOUNT),
                # All file systems, hidden: lets us bind-mount one whose mount
                # target appears after the node started (see _do_mount).
                "-v",
                "%s:/localcloud/.efs-root" % config.efs_dir(),
            ]
            for fs in fs_ids:
                os.makedirs(config.efs_dir(fs), exist_ok=True)
                args += ["-v", "%s:%s/%s" % (config.efs_dir(fs), config.EFS_MOUNT_ROOT, fs)]
            # An AMI made by CreateImage boots its own image (a baked node), any other the stock one.
            args.append(baked_images.image_for(inst.ami_id))
            podman.run(args, timeout=120)
            with self.lock:
                self.created.add(inst.id)
                self.halted.discard(inst.id)
                self.mounted[inst.id] = set(fs_ids)
                self.volumes[inst.id] = set(fs_ids)
            self._await_sshd(inst, start, "up", fs_ids)
            # A stopped instance whose container was gone gets a new one: started (no-op when running).
            moto_compat.settle(inst.id, "pending", "running")
        except Exception as e:  # keep the loop alive; plan() retries (bounded)
            log.error(
                "%s: create failed (attempt %d/%d): %s", inst.id, self.attempts.get(inst.id, 0), MAX_CREATE_ATTEMPTS, e
            )
            podman.remove(inst.id)
        finally:
            with self.lock:
                self.busy.discard(inst.id)

    def _do_halt(self, a, inst, fs_vpcs):
        self._start_thread("halt", self._halt, inst)

    def _halt(self, inst):
        """StopInstances: shut the node down and keep it (its disk), then `stopping` -> `stopped`."""
        start = time.monotonic()
        try:
            # Also for a container that already exited (a lost node): stopping it is the
            # EC2 remedy, and the next start boots it again. IMDS: _sync_imds stops it.
            r = podman.stop(inst.id, timeout=STOP_TIMEOUT_S)
            gone = r.returncode != 0 and "no such container" in r.stderr.lower()
            if r.returncode != 0 and not gone:
                log.error("%s: stopping the container failed (%d): %s", inst.id, r.returncode, r.stderr.strip())
                return  # still `stopping`: plan() halts it again
            with self.lock:
                self.halted.add(inst.id)
                self.lost.pop(inst.id, None)
                self.attempts.pop(inst.id, None)
            moto_compat.set_impaired(inst.id, None)
            moto_compat.settle(inst.id, "stopping", "stopped")
            if gone:
                log.info("%s: instance stopped (no container)", inst.id)
            else:
                log.info("%s: node stopped after %.1f s, container kept", inst.id, time.monotonic() - start)
        except Exception as e:  # keep the loop alive; plan() halts it again
            log.error("%s: stop failed: %s", inst.id, e)
        finally:
            with self.lock:
                self.busy.discard(inst.id)

    def _do_resume(self, a, inst, fs_vpcs):
        n = self.attempts.get(inst.id, 0)
        if n >= MAX_CREATE_ATTEMPTS:
            return
        self.attempts[inst.id] = n + 1
        self._start_thread("resume", self._resume, inst)

    def _resume(self, inst):
        """StartInstances of an instance we halted: boot the same container, then `pending` -> `running`."""
        start = time.monotonic()
        try:
            self._write_instance_files(inst)
            podman.start(inst.id)
            with self.lock:
                self.halted.discard(inst.id)
                self.attempts.pop(inst.id, None)
                # The -v volumes came back with it; bind mounts made later did not (a new
                # mount namespace): plan_mounts makes them again.
                self.mounted[inst.id] = set(self.volumes.get(inst.id, ()))
            self._await_sshd(inst, start, "started again (same container)", sorted(self.volumes.get(inst.id, ())))
            # EC2 says `running` once the machine booted, whether its OS answers or not.
            moto_compat.settle(inst.id, "pending", "running")
        except Exception as e:  # keep the loop alive; plan() retries (bounded)
            n = self.attempts.get(inst.id, 0)
            log.error("%s: start failed (attempt %d/%d): %s", inst.id, n, MAX_CREATE_ATTEMPTS, e)
            if n >= MAX_CREATE_ATTEMPTS:
                # As EC2 does with a start it cannot make: back to `stopped` (unless a stop or a
                # terminate came first). Either way a later StartInstances begins from the first attempt.
                if moto_compat.start_failed(inst.id):
                    log.error("%s: gave up starting it: the instance is stopped again", inst.id)
                with self.lock:
                    self.attempts.pop(inst.id, None)
        finally:
            with self.lock:
                self.busy.discard(inst.id)

    def _do_mount(self, a, inst, fs_vpcs):
        fs = a.reason
        os.makedirs(config.efs_dir(fs), exist_ok=True)
        target = "%s/%s" % (config.EFS_MOUNT_ROOT, fs)
        script = "mountpoint -q {t} || {{ mkdir -p {t} && mount --bind /localcloud/.efs-root/{fs} {t}; }}".format(
            t=target, fs=fs
        )
        r = podman.exec_(a.instance_id, ["sh", "-c", script])
        if r.returncode == 0:
            log.info("%s: mounted EFS %s at %s", a.instance_id, fs, target)
            with self.lock:
                self.mounted.setdefault(a.instance_id, set()).add(fs)
        else:
            log.warning("%s: mounting EFS %s failed: %s", a.instance_id, fs, r.stderr.strip())

    def _sync_efs_dirs(self, fs_vpcs):
        current = set(fs_vpcs)
        for fs in current - self.known_fs:
            os.makedirs(config.efs_dir(fs), exist_ok=True)
            log.info("EFS %s: %s", fs, config.efs_dir(fs))
        # DeleteFileSystem deletes the data, as on AWS. Only ids we saw exist
        # are removed, so a failed describe can never wipe anything.
        for fs in self.known_fs - current:
            shutil.rmtree(config.efs_dir(fs), ignore_errors=True)
            log.info("EFS %s deleted: directory removed", fs)
        self.known_fs = current

    def _sync_imds(self, instances):
        wanted = {i.id: i for i in instances if wants_node(i)}
        for iid in list(self.imds.servers):
            if iid not in wanted:
                self.imds.stop(iid)
        for iid, i in wanted.items():
            meta = InstanceMetadata(
                iid,
                i.private_ip,
                instance_type=i.instance_type,
                region=i.region,
                availability_zone=i.az,
                public_key=i.public_key,
                key_name=i.key_name,
                ami_id=i.ami_id,
                tags=i.tags,
                launch_time=i.launch_time,
                iam_role=i.iam_role,
                lifecycle=i.lifecycle,
                public_ip=i.public_ip,
            )
            try:
                self.imds.ensure(meta)
                self.imds_failed.discard(iid)
            except OSError as e:
                if iid not in self.imds_failed:
                    self.imds_failed.add(iid)
                    log.error("%s: IMDS on %s:%d failed: %s", iid, i.private_ip, self.imds.port, e)

    # -- spot interruptions ----------------------------------------------
    def interrupt(self, instance_id, after):
        inst = next((i for i in self.last["instances"] if i.id == instance_id), None)
        if inst is None or inst.state not in LIVE_STATES:
            return None
        intr = self.imds.interrupt(instance_id, after)
        self.terminations[instance_id] = (inst.region, intr.terminate_at)
        log.info("%s: spot interruption scheduled, termination in %d s", instance_id, after)
        return intr

    def _terminate_due(self, now=None):
        now = time.time() if now is None else now
        for iid, (region, at) in list(self.terminations.items()):
            if now >= at:
                log.info("%s: spot interruption: terminating", iid)
                try:
                    self.clients("ec2", region).terminate_instances(InstanceIds=[iid])
                except Exception as e:  # already gone: nothing to do
                    log.warning("%s: terminate failed: %s", iid, e)
                del self.terminations[iid]

    # -- report / stop ----------------------------------------------------
    def snapshot(self):
        with self.lock:
            last = dict(self.last)
            return {
                "at": last["at"],
                "instances": [
                    {
                        "id": i.id,
                        "region": i.region,
                        "state": i.state,
                        "private_ip": i.private_ip,
                        "public_ip": i.public_ip,
                        "vpc_id": i.vpc_id,
                        "container": last["containers"].get(i.id),
                        "lost": self.lost.get(i.id),
                        "halted": i.id in self.halted,
                        "efs": sorted(self.mounted.get(i.id, ())),
                        "imds": i.id in self.imds.servers,
                        "interruption": (
                            self.imds.interruptions[i.id].instance_action() if i.id in self.imds.interruptions else None
                        ),
                    }
                    for i in last["instances"]
                ],
                "containers": last["containers"],
                "efs": {fs: sorted(v) for fs, v in last["fs_vpcs"].items()},
            }

    def shutdown(self, timeout=60):
        """Remove every node of this cloud: moto's state dies with the daemon."""
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.1, deadline - time.monotonic()))
        self.imds.stop_all()
        remove_all_containers(self.home)


def remove_all_containers(home):
    names = list(podman.list_containers(home))
    # In parallel: a large cluster shouldn't make `down` take minutes.
    threads = [threading.Thread(target=podman.remove, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    for n in names:
        log.info("%s: container removed", n)
        shutil.rmtree(config.instance_dir(n), ignore_errors=True)
    # The AMIs of CreateImage die with moto's state: their images go with the nodes.
    baked_images.remove_all(home)
    return names
