"""Fill gaps in moto that the real amazon.aws/community.aws modules hit.

community.aws.efs and efs_info call EFS's legacy tag API (DescribeTags,
CreateTags, DeleteTags), which moto 5 does not route. They are thin aliases
of the resource-tag API moto does implement, so we add them here instead of
re-writing EFS calls by hand in the playbooks.

moto ignores a launch template's network interface (subnet, security groups)
and metadata options; EC2 applies them. Without that, instances launched from
our templates would get random 10.x addresses instead of loopback ones.

EC2 also applies a launch template's InstanceMarketOptions (a spot template
launches spot instances); moto honours only the request's. And EC2's spot
capacity runs out: `set_spot_capacity(n)` (the daemon's control endpoint,
`python -m localcloud spot-capacity N|unlimited`, or DT_LOCALCLOUD_SPOT_CAPACITY
at start) caps the pending/running spot instances; a spot RunInstances beyond
it fails like EC2's (InsufficientInstanceCapacity, HTTP 500). EC2 may also have no capacity for a
stopped instance's type when it is started again: `set_no_start_capacity(ids)` (the control endpoint,
`python -m localcloud no-start-capacity i-...`) makes a StartInstances of any of those stopped
instances fail the same way (the instance stays `stopped`), until it is disarmed.

EC2's GetConsoleOutput returns what the instance printed on its console, among
it cloud-init's SSH host key fingerprints (the product checks scanned host keys
against them); moto returns a fixed sample. Here it is the node's console: the
journal of its boot, where localcloud-init prints the fingerprints as cloud-init
does. A node with no container (yet) gets moto's sample, which lists none.

EC2 gives an instance a public address when its subnet maps public IPs or its
launch template's interface says AssociatePublicIpAddress; moto draws it from
54.214.x.y, which nobody here can reach. Here it comes from the loopback
"public pool" 127.254.0.0/16 (PUBLIC_POOL): random like EC2's, never .0/.255,
never one a live interface of this cloud holds (moto drops it on stop and
terminate, as EC2 does) nor one where something on this machine already
answers on port 22 (a node of another local cloud beside this one).

S3 evaluates a bucket policy statement only when its conditions hold; moto ignores the
conditions it does not know (`Bool`) and applies a Deny anyway, so the checkpoint bucket's
"deny without TLS" (`aws:SecureTransport` false) refused every object call. Here a statement
whose `aws:SecureTransport` condition does not hold is left out. The local cloud's plain-HTTP
loopback endpoint stands for S3's HTTPS one (nothing leaves the machine), so its requests count
as TLS; `set_secure_transport(False)` makes them plain requests, which such a policy refuses.

EC2's DescribeInstanceStatus reports an instance whose machine stopped answering (a hung or dead
OS) as `InstanceStatus: impaired` (its reachability check failed) while the instance stays
`running`; moto always answers `ok`. Here a node the reconciler found lost (its container died:
`podman kill`, an OOM) is `impaired` the same way (`set_impaired`), until the instance is gone;
bootstrap replaces a silent master only with that second signal.

EC2's StopInstances leaves an instance `stopping` until its machine has shut down, then `stopped`;
StartInstances leaves it `pending` until it booted, then `running`. moto jumps to `stopped` and
`running` at once. With `use_transitions(True)` (the daemon: its reconciler stops and starts the
nodes) the instance stays `stopping`/`pending` until the reconciler calls `settle()`. Without it
(an in-process moto with no reconciler, as the playbook tests run) nobody would settle them, so
moto's immediate states stay. Either way, as on EC2, starting a pending/running instance or
stopping a stopping/stopped one changes nothing (moto drew a new public IP for a running one),
and a terminated instance, or a stopping one asked to start, is refused (IncorrectInstanceState).

`apply()` must run before the moto server handles its first request.
"""

import copy
import ipaddress
import json
import os
import random
import socket
import threading

_APPLIED = False

SPOT_CAPACITY_ENV = "DT_LOCALCLOUD_SPOT_CAPACITY"
CAPACITY_ERROR = "InsufficientInstanceCapacity"    # EC2's code for a shortage: a spot launch, a start
SPOT_CAPACITY_ERROR = CAPACITY_ERROR
SPOT_CAPACITY_MESSAGE = "There is no Spot capacity available that matches your request."
_spot = {"capacity": None}
_spot_lock = threading.RLock()


def parse_spot_capacity(value):
    """'unlimited'/''/None -> None; a whole number >= 0 -> int; anything else: ValueError."""
    if value is None or str(value).strip().lower() in ("", "unlimited", "none"):
        return None
    text = str(value).strip()
    if not text.isdigit():
        raise ValueError("spot capacity must be a whole number >= 0 or 'unlimited', not %r" % value)
    return int(text)


def set_spot_capacity(value):
    """Cap the spot instances that may be pending/running (None: unlimited); returns the cap."""
    _spot["capacity"] = parse_spot_capacity(value)
    return _spot["capacity"]


def spot_capacity():
    return _spot["capacity"]


def spot_capacity_from_env(environ=None):
    """The cap DT_LOCALCLOUD_SPOT_CAPACITY asks for at start (unset: unlimited)."""
    return parse_spot_capacity((os.environ if environ is None else environ).get(SPOT_CAPACITY_ENV))


# "We currently do not have sufficient <type> capacity in the Availability Zone you requested": EC2's
# answer to a StartInstances whose stopped instance it cannot place (reported with the instance's type/zone).
START_CAPACITY_MESSAGE = ("We currently do not have sufficient %s capacity in the Availability Zone you requested "
                          "(%s). Our system will be working on provisioning additional capacity.")
_no_start_capacity = set()
_no_start_capacity_lock = threading.Lock()


def set_no_start_capacity(instance_ids):
    """The instances whose start EC2 has no capacity for (replaces the set; empty: every start works); sorted."""
    if not isinstance(instance_ids, (list, tuple, set)) or not all(
            isinstance(i, str) and i.startswith("i-") for i in instance_ids):
        raise ValueError("instance ids must be a list of 'i-...' strings, not %r" % (instance_ids,))
    with _no_start_capacity_lock:
        _no_start_capacity.clear()
        _no_start_capacity.update(instance_ids)
        return sorted(_no_start_capacity)


def no_start_capacity():
    """The instance ids armed by set_no_start_capacity, sorted."""
    with _no_start_capacity_lock:
        return sorted(_no_start_capacity)


PUBLIC_POOL = ipaddress.ip_network("127.254.0.0/16")
_public_lock = threading.Lock()


def _public_ips_in_use():
    from moto.ec2.models import ec2_backends

    return {
        eni.public_ip
        for account in list(dict.values(ec2_backends))
        for backend in list(dict.values(account))
        for eni in list(backend.enis.values())
        if eni.public_ip
    }


def _answers_ssh(ip):
    try:
        with socket.create_connection((ip, 22), timeout=0.2):
            return True
    except OSError:
        return False


def free_public_ip(in_use=(), rng=random):
    """A random address of PUBLIC_POOL not in `in_use`, never .0/.255, nobody's sshd on it."""
    base = int(PUBLIC_POOL.network_address)
    for _attempt in range(1000):
        ip = str(ipaddress.ip_address(base + rng.randrange(PUBLIC_POOL.num_addresses)))
        if ip.rsplit(".", 1)[1] not in ("0", "255") and ip not in in_use and not _answers_ssh(ip):
            return ip
    raise RuntimeError("no free address in the local cloud's public pool %s" % PUBLIC_POOL)


def _patch_public_ips():
    from moto.ec2.models.elastic_network_interfaces import NetworkInterface

    def check_auto_public_ip(self):
        # moto's own test, but the address from the loopback pool; chosen and set
        # under one lock so that two launches at once never get the same one.
        if self.public_ip_auto_assign and str(self.public_ip_auto_assign).lower() == "true":
            with _public_lock:
                self.public_ip = free_public_ip(_public_ips_in_use())

    NetworkInterface.check_auto_public_ip = check_auto_public_ip


def _describe_tags(self):
    fs_id = self._get_param("FileSystemId")
    tags = self.efs_backend.list_tags_for_resource(fs_id)
    return json.dumps({"Tags": tags}), {"Content-Type": "application/json"}


def _create_tags(self):
    fs_id = self._get_param("FileSystemId")
    tags = {t["Key"]: t.get("Value") for t in (self._get_param("Tags") or [])}
    self.efs_backend.tag_resource(fs_id, tags)
    return "", {"status": 204}


def _delete_tags(self):
    fs_id = self._get_param("FileSystemId")
    self.efs_backend.untag_resource(fs_id, self._get_param("TagKeys") or [])
    return "", {"status": 204}


def _patch_launch_template_network():
    from moto.ec2.models.instances import InstanceBackend

    original = InstanceBackend.run_instances

    def run_instances(self, image_id, count, user_data, security_group_names, **kwargs):
        template_arg = kwargs.get("launch_template")
        if template_arg and not kwargs.get("nics") and not kwargs.get("subnet_id"):
            data = self._get_template_from_args(template_arg).data
            nics = [dict(n) for n in data.get("NetworkInterfaces") or []]
            primary = next((n for n in nics if str(n.get("DeviceIndex", "0")) == "0"), None)
            if primary:
                # EC2 takes subnet, groups and public-IP choice from the template's
                # primary interface; moto would give a random 10.x address.
                kwargs["subnet_id"] = primary.get("SubnetId")
                if not kwargs.get("security_group_ids") and primary.get("Groups"):
                    kwargs["security_group_ids"] = list(primary["Groups"])
                if kwargs.get("associate_public_ip") is None and "AssociatePublicIpAddress" in primary:
                    kwargs["associate_public_ip"] = str(primary["AssociatePublicIpAddress"]).lower() == "true"
            if not kwargs.get("metadata_options") and data.get("MetadataOptions"):
                kwargs["metadata_options"] = dict(data["MetadataOptions"])
        named = kwargs.get("iam_instance_profile_name") or kwargs.get("iam_instance_profile_arn")
        profile = (self._get_template_from_args(template_arg).data.get("IamInstanceProfile") or {}) \
            if template_arg and not named else {}
        reservation = original(self, image_id, count, user_data, security_group_names, **kwargs)
        if profile.get("Name") or profile.get("Arn"):
            # EC2 gives every instance the template's instance profile (moto: only a
            # profile named in the request itself), so IMDS serves its credentials.
            for instance in reservation.instances:
                self.associate_iam_instance_profile(
                    instance_id=instance.id,
                    iam_instance_profile_name=profile.get("Name"),
                    iam_instance_profile_arn=profile.get("Arn"),
                )
        return reservation

    InstanceBackend.run_instances = run_instances


class InsufficientCapacity(Exception):
    """Raised by the patched backend (a spot launch, a start); answered as EC2 does (_answer_capacity_shortage)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code, self.message = code, message


def _answer_capacity_shortage(response_method):
    """An EC2 response method whose InsufficientCapacity is answered as EC2 answers a capacity shortage."""
    from moto.core.responses import ActionResult
    from moto.ec2.exceptions import EC2ClientError

    def answer(self):
        try:
            return response_method(self)
        except InsufficientCapacity as shortage:
            # EC2 answers a capacity shortage with a server error (HTTP 500), which
            # botocore and amazon.aws retry before giving up, as against AWS.
            error = EC2ClientError(shortage.code, shortage.message)
            _status, headers, body = self.serialized(ActionResult(error))
            headers["status"] = 500
            return body, headers

    return answer


def _running_spot_instances(backend):
    return sum(
        1
        for reservation in backend.reservations.values()
        for instance in reservation.instances
        if instance.lifecycle == "spot" and instance.state in ("pending", "running")
    )


def _patch_spot_market():
    from moto.ec2.models.instances import InstanceBackend

    original = InstanceBackend.run_instances

    def run_instances(self, image_id, count, user_data, security_group_names, **kwargs):
        template_arg = kwargs.get("launch_template")
        if template_arg and not kwargs.get("instance_market_options"):
            market = (self._get_template_from_args(template_arg).data.get("InstanceMarketOptions") or {})
            if market.get("MarketType"):
                # EC2 launches what the template's market options say (moto: request only).
                kwargs["instance_market_options"] = market["MarketType"]
        if kwargs.get("instance_market_options") == "spot":
            with _spot_lock:
                cap = _spot["capacity"]
                if cap is not None and _running_spot_instances(self) + int(count) > cap:
                    raise InsufficientCapacity(SPOT_CAPACITY_ERROR, SPOT_CAPACITY_MESSAGE)
                return original(self, image_id, count, user_data, security_group_names, **kwargs)
        return original(self, image_id, count, user_data, security_group_names, **kwargs)

    InstanceBackend.run_instances = run_instances

    from moto.ec2.responses.instances import InstanceResponse

    InstanceResponse.run_instances = _answer_capacity_shortage(InstanceResponse.run_instances)


def _patch_start_capacity():
    """StartInstances of a stopped instance armed by set_no_start_capacity fails as EC2's does; none starts."""
    from moto.ec2.models.instances import InstanceBackend
    from moto.ec2.responses.instances import InstanceResponse

    original = InstanceBackend.start_instances

    def start_instances(self, instance_ids):
        # the check and the starts under one lock: a disarm or another start cannot come in between
        with _state_lock:
            for instance in self.get_multi_instances_by_id(instance_ids):
                # only a stopped instance needs capacity (a pending/running one's start changes nothing)
                if instance.state == "stopped" and instance.id in no_start_capacity():
                    raise InsufficientCapacity(CAPACITY_ERROR, START_CAPACITY_MESSAGE
                                               % (instance.instance_type, instance.availability_zone))
            return original(self, instance_ids)

    InstanceBackend.start_instances = start_instances
    InstanceResponse.start_instances = _answer_capacity_shortage(InstanceResponse.start_instances)


def _delete_launch_template_versions(self):
    # moto has no DeleteLaunchTemplateVersions; amazon.aws.ec2_launch_template
    # calls it before DeleteLaunchTemplate. Versions are positional in moto, so
    # they are reported deleted and go away with the template itself.
    from moto.core.responses import ActionResult

    name = self._get_param("LaunchTemplateName")
    tid = self._get_param("LaunchTemplateId")
    template = self.ec2_backend.get_launch_template_by_name(name) if name else self.ec2_backend.get_launch_template(tid)
    versions = self._get_param("LaunchTemplateVersions", []) or []
    deleted = [
        {"LaunchTemplateId": template.id, "LaunchTemplateName": template.name, "VersionNumber": int(v)}
        for v in versions
    ]
    return ActionResult({"SuccessfullyDeletedLaunchTemplateVersions": deleted, "UnsuccessfullyDeletedLaunchTemplateVersions": []})


def _patch_launch_template_tags():
    # moto copies the template's own tags (TagSpecifications of type
    # launch-template) into version 1's data; EC2 does not. The copy made
    # amazon.aws.ec2_launch_template see a change on its second run.
    from moto.ec2.models.launch_templates import LaunchTemplateBackend

    original = LaunchTemplateBackend.create_launch_template

    def create_launch_template(self, name, description, template_data, tag_spec):
        specs = [t for t in template_data.get("TagSpecifications") or []
                 if t.get("ResourceType") != "launch-template"]
        if specs:
            template_data["TagSpecifications"] = specs
        else:
            template_data.pop("TagSpecifications", None)
        return original(self, name, description, template_data, tag_spec)

    LaunchTemplateBackend.create_launch_template = create_launch_template


def _node_console(instance_id):
    """The node's boot messages (its journal), or None when it has no running container."""
    from . import podman

    try:
        proc = podman.exec_(instance_id, ["journalctl", "-b", "-o", "cat", "--no-pager"], timeout=20)
    except Exception:  # noqa: BLE001  a podman failure is "no console yet", as on EC2
        return None
    return proc.stdout if proc.returncode == 0 and proc.stdout.strip() else None


def _patch_console_output():
    from moto.core.responses import ActionResult
    from moto.core.utils import utcnow
    from moto.ec2.responses import general
    from moto.ec2.utils import Base64EncodedString

    def get_console_output(self):
        instance = self.ec2_backend.get_instance(self._get_param("InstanceId"))
        text = _node_console(instance.id) or general.SAMPLE_CONSOLE_OUTPUT
        return ActionResult({"InstanceId": instance.id, "Timestamp": utcnow(),
                             "Output": Base64EncodedString.from_raw_string(text)})

    general.General.get_console_output = get_console_output


def _patch_bucket_tags():
    """A deleted bucket takes its tags with it, as on AWS.

    Moto keeps them under the bucket's ARN, so a new bucket of the same name came back tagged and
    amazon.aws.s3_bucket skipped PutBucketTagging: a call AWS would see.
    """
    from moto.s3.models import S3Backend

    original = S3Backend.delete_bucket

    def delete_bucket(self, bucket_name):
        bucket = self.get_bucket(bucket_name)
        deleted = original(self, bucket_name)
        if deleted is not None:
            self.tagger.delete_all_tags_for_resource(bucket.arn)
        return deleted

    S3Backend.delete_bucket = delete_bucket


_transport = {"secure": True}


def set_secure_transport(secure):
    """Whether the local cloud's requests count as TLS (aws:SecureTransport) in S3 bucket policies."""
    _transport["secure"] = bool(secure)


def _condition_holds(condition, context):
    """False when a condition on a key of `context` (Bool / StringEquals) does not hold; True otherwise,
    as moto treats the conditions it does not evaluate."""
    for operator, values in (condition or {}).items():
        if operator not in ("Bool", "StringEquals"):
            continue
        for key, expected in values.items():
            if key not in context:
                continue
            expected = [expected] if isinstance(expected, str) else list(expected)
            if context[key].lower() not in [str(e).lower() for e in expected]:
                return False
    return True


def _patch_bucket_policy_conditions():
    from moto.s3.models import FakeBucket

    original = FakeBucket.get_permission

    def get_permission(self, action, resource):
        if self.policy is None:
            return original(self, action, resource)
        document = json.loads(self.policy.decode())
        statements = document.get("Statement", [])
        statements = statements if isinstance(statements, list) else [statements]
        context = {"aws:SecureTransport": "true" if _transport["secure"] else "false"}
        kept = [st for st in statements if _condition_holds(st.get("Condition"), context)]
        if len(kept) == len(statements):
            return original(self, action, resource)
        from moto.iam.access_control import IAMPolicy, PermissionResult

        if not kept:
            return PermissionResult.NEUTRAL
        return IAMPolicy(json.dumps(dict(document, Statement=kept))).is_action_permitted(action, resource)

    FakeBucket.get_permission = get_permission


_impaired = {}  # instance id -> (reason, ISO time since when)
_impaired_lock = threading.Lock()


def set_impaired(instance_id, reason=None):
    """Mark an instance's machine lost (its status checks fail) or, with reason None, answering again."""
    from moto.core.utils import utcnow

    with _impaired_lock:
        if reason is None:
            _impaired.pop(instance_id, None)
        elif instance_id not in _impaired:
            _impaired[instance_id] = (reason, utcnow().strftime("%Y-%m-%dT%H:%M:%S.000Z"))


def impaired(instance_id):
    """(reason, since) of a lost node's instance, or None."""
    with _impaired_lock:
        return _impaired.get(instance_id)


def _patch_instance_status():
    from moto.ec2.models.instances import Instance

    original = Instance.instance_status

    def instance_status(self):
        lost = impaired(self.id)
        if lost is None or self.state_code != 16:
            return original.fget(self)
        return {"Status": "impaired", "Details": [{"Name": "reachability", "Status": "failed", "ImpairedSince": lost[1]}]}

    Instance.instance_status = property(instance_status)


STATE_CODES = {"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48, "stopping": 64, "stopped": 80}
# One lock for every state change of an instance we make or patch (stop, start, terminate,
# settle): moto's server answers requests on several threads and the reconciler settles from
# its own, so "still stopping? then stopped" must not interleave with a TerminateInstances.
_state_lock = threading.RLock()
_transitions = {"enabled": False}
# A request that changes which nodes should run (a launch, a start, a stop, a terminate) wakes the
# daemon's reconciler at once: a node's boot is modelled as instant, not as up to a tick's wait.
_changed = threading.Event()


def state_changed():
    """Wake the reconciler now (the daemon waits in wait_for_change between ticks)."""
    _changed.set()


def wait_for_change(timeout):
    """Wait up to timeout s for state_changed(); True when it came."""
    came = _changed.wait(timeout)
    _changed.clear()
    return came


def use_transitions(enabled=True):
    """Leave stopped/started instances `stopping`/`pending` until settle() (the daemon's reconciler)."""
    _transitions["enabled"] = bool(enabled)


def _find_instance(instance_id):
    from moto.ec2.models import ec2_backends

    # dict.values: moto's backend dicts make a backend on a missing key; only look at existing ones.
    for account in list(dict.values(ec2_backends)):
        for backend in list(dict.values(account)):
            for reservation in list(backend.reservations.values()):
                for instance in reservation.instances:
                    if instance.id == instance_id:
                        return instance
    return None


def _set_state(instance, name):
    instance._state.name = name
    instance._state.code = STATE_CODES[name]


def settle(instance_id, from_state, to_state):
    """Move an instance to to_state if it is still in from_state (True when it moved).

    The reconciler: `stopping` -> `stopped` once its container stopped, `pending` -> `running`
    once the node answers. A request in between (a TerminateInstances, a StopInstances of a
    starting instance) wins: the instance is no longer in from_state and stays as it is.
    """
    with _state_lock:
        instance = _find_instance(instance_id)
        if instance is None or instance.state != from_state:
            return False
        _set_state(instance, to_state)
        return True


def start_failed(instance_id):
    """A start the machine could not make: `pending` -> `stopped`, as EC2 returns an instance whose
    StartInstances it could not fulfil (state reason ``Server.InternalError``, the public IP released
    again). True when it moved; a request in between (a stop, a terminate) wins, as in settle()."""
    from moto.ec2.models.instances import StateReason

    with _state_lock:
        instance = _find_instance(instance_id)
        if instance is None or instance.state != "pending":
            return False
        _set_state(instance, "stopped")
        for nic in instance.nics.values():
            nic.stop()
        instance.state_reason = StateReason("Server.InternalError: Internal error on launch", "Server.InternalError")
        return True


def _incorrect_state(instance, verb):
    from moto.ec2.exceptions import EC2ClientError

    return EC2ClientError(
        "IncorrectInstanceState", "The instance '%s' is not in a state from which it can be %s." % (instance.id, verb)
    )


def _patch_stop_start():
    from moto.core.utils import utcnow
    from moto.ec2.models.instances import Instance, StateReason

    stop, start, terminate = Instance.stop, Instance.start, Instance.terminate

    # With transitions, moto's stop/start are done here in an order where no request ever sees
    # `stopped`/`running` (moto's end states) before the reconciler settles them: a waiter
    # (instance_stopped) would take a node for stopped while it still runs.
    def patched_stop(self):
        with _state_lock:
            if self.state in ("stopping", "stopped"):
                return copy.copy(self._state)  # already on its way: nothing changes, as on EC2
            if self.state in ("shutting-down", "terminated"):
                raise _incorrect_state(self, "stopped")
            if not _transitions["enabled"]:
                return stop(self)
            previous = copy.copy(self._state)
            _set_state(self, "stopping")
            for nic in self.nics.values():
                nic.stop()  # releases an auto-assigned public IP, as EC2 does
            self._reason = "User initiated (%s)" % utcnow().strftime("%Y-%m-%d %H:%M:%S UTC")
            self.state_reason = StateReason(
                "Client.UserInitiatedShutdown: User initiated shutdown", "Client.UserInitiatedShutdown"
            )
            state_changed()
            return previous

    def patched_start(self):
        with _state_lock:
            if self.state in ("pending", "running"):
                return copy.copy(self._state)  # moto would draw a new public IP for a running instance
            if self.state != "stopped":
                raise _incorrect_state(self, "started")
            if not _transitions["enabled"]:
                return start(self)
            previous = copy.copy(self._state)
            _set_state(self, "pending")
            for nic in self.nics.values():
                nic.start()  # a new public IP when the subnet/template maps them (check_auto_public_ip)
            self._reason = ""
            self.state_reason = StateReason()
            state_changed()
            return previous

    def patched_terminate(self):
        with _state_lock:
            try:
                return terminate(self)
            finally:
                state_changed()

    Instance.stop = patched_stop
    Instance.start = patched_start
    Instance.terminate = patched_terminate


def _patch_launch_wake():
    """A RunInstances wakes the reconciler (stop, start and terminate do in _patch_stop_start)."""
    from moto.ec2.models.instances import InstanceBackend

    run_instances = InstanceBackend.run_instances

    def launch_and_wake(self, *args, **kwargs):
        try:
            return run_instances(self, *args, **kwargs)
        finally:
            state_changed()

    InstanceBackend.run_instances = launch_and_wake


def _missing_boundary(backend, arn):
    """IAM refuses a permissions boundary that is not a policy of the account (moto takes any ARN)."""
    if not arn or ":iam::aws:policy/" in arn:      # AWS-managed: moto may not load them; IAM has them
        return None
    if arn in backend.managed_policies:
        return None
    return "Scope ARN: %s does not exist or is not attachable." % arn


def _patch_permissions_boundary():
    """CreateRole / PutRolePermissionsBoundary with a boundary policy that does not exist fail as on IAM
    (NoSuchEntity): without it, a cluster made before an administrator created the boundary would work
    here and fail on AWS."""
    from moto.iam.exceptions import NotFoundException
    from moto.iam.models import IAMBackend

    create_role = IAMBackend.create_role
    put_boundary = IAMBackend.put_role_permissions_boundary

    def checked_create_role(self, role_name, assume_role_policy_document, path, permissions_boundary, *args,
                            **kwargs):
        problem = _missing_boundary(self, permissions_boundary)
        if problem:
            raise NotFoundException(problem)
        return create_role(self, role_name, assume_role_policy_document, path, permissions_boundary, *args,
                           **kwargs)

    def checked_put_boundary(self, role_name, permissions_boundary):
        problem = _missing_boundary(self, permissions_boundary)
        if problem:
            raise NotFoundException(problem)
        return put_boundary(self, role_name, permissions_boundary)

    IAMBackend.create_role = checked_create_role
    IAMBackend.put_role_permissions_boundary = checked_put_boundary


def apply():
    """Fill the gaps above in moto (idempotent)."""
    global _APPLIED
    if _APPLIED:
        return
    from moto.efs import urls
    from moto.efs.responses import EFSResponse

    EFSResponse.describe_tags = _describe_tags
    EFSResponse.create_tags = _create_tags
    EFSResponse.delete_tags = _delete_tags
    for path in (
        "/2015-02-01/tags/<file_system_id>/",
        "/2015-02-01/create-tags/<file_system_id>",
        "/2015-02-01/delete-tags/<file_system_id>",
    ):
        urls.url_paths[path] = urls.response.dispatch
    _patch_launch_template_network()
    _patch_launch_template_tags()
    _patch_spot_market()
    _patch_start_capacity()
    _patch_console_output()
    _patch_public_ips()
    _patch_bucket_tags()
    _patch_instance_status()
    _patch_bucket_policy_conditions()
    _patch_permissions_boundary()
    _patch_stop_start()
    _patch_launch_wake()
    set_spot_capacity(spot_capacity_from_env())
    from moto.ec2.responses.launch_templates import LaunchTemplates

    LaunchTemplates.delete_launch_template_versions = _delete_launch_template_versions
    _APPLIED = True
