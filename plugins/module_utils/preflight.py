# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""The pure checks of playbooks/preflight.yml (the one home of each rule; no AWS calls here):

- admin_cidr_problem(): dt_admin_cidr must be an IPv4 network in canonical form (no host bits)
  with a prefix of at least /16 (loopback, the local cloud's 127.0.0.0/8, excepted);
- choose_az(): the availability zone that offers every instance type asked for;
- settings_problems(): the settings a user types (-e or the inventory), checked by every entry point
  before anything is created (dt_train_script_args in each form, resume_from, dt_checkpoint_bucket,
  dt_job_name, dt_vpc_cidr/dt_subnet_cidr, dt_resize_at, dt_engine and the instance types -- MXNet's GPU
  kernels, a torch cluster's master and workers all with or all without GPUs --, the timeouts and bounds);
  script_args() normalises dt_train_script_args where it is used.

Each returns or raises a message that says what to pass instead.
"""

from __future__ import annotations

import ast
import ipaddress
import json
import re
import shlex

from ansible_collections.dynatrain.elastic.plugins.module_utils.gpu_select import (
    PRE_TURING,
    gpu_family,
    instance_family,
    mxnet_gpu_kernels,
)

MIN_ADMIN_PREFIX = 16
EXAMPLE_ADMIN_CIDR = "203.0.113.7/32"
HOW_TO_FIND_YOURS = "curl -s https://checkip.amazonaws.com gives the address you connect from"


def admin_cidr_problem(cidr, min_prefix=MIN_ADMIN_PREFIX):
    """'' when `cidr` may be the only source of SSH, else why not and what to pass instead."""
    name = "dt_admin_cidr"
    if cidr is None or not isinstance(cidr, str) or not cidr.strip():
        return (
            f"{name} is not set: SSH to the nodes is allowed only from it. Pass the address you administer "
            f"the cluster from, e.g. -e {name}={EXAMPLE_ADMIN_CIDR} ({HOW_TO_FIND_YOURS})."
        )
    text = cidr.strip()
    if "/" not in text:
        try:
            address = ipaddress.IPv4Address(text)
        except ValueError:
            address = None
        if address is not None:
            return f"{name}={text} has no prefix length: pass -e {name}={text}/32 for that one address."
    try:
        network = ipaddress.IPv4Network(text, strict=False)
    except ValueError:
        return (
            f"{name}={text} is not an IPv4 CIDR: pass an IPv4 network such as "
            f"-e {name}={EXAMPLE_ADMIN_CIDR} ({HOW_TO_FIND_YOURS})."
        )
    if network.prefixlen < min_prefix and not network.is_loopback:
        return (
            f"{name}={text} would open SSH to {network.num_addresses} addresses "
            f"({'the whole internet' if network.prefixlen == 0 else 'a large part of the internet'}): "
            f"the prefix must be at least /{min_prefix}. Pass the address you administer the cluster from, "
            f"e.g. -e {name}={EXAMPLE_ADMIN_CIDR} ({HOW_TO_FIND_YOURS}), or your office network "
            f"(/{min_prefix} or longer)."
        )
    if str(network) != text:
        host = text.split("/", 1)[0]
        return (
            f"{name}={text} has host bits set (its network is {network}, which AWS would silently "
            f"open instead): pass -e {name}={network} for that network, or -e {name}={host}/32 for "
            "that one address."
        )
    return ""


def choose_az(offerings, instance_types, zones, wanted="", region=""):
    """The availability zone for the cluster's subnet.

    offerings: {instance type: [zones offering it]} (DescribeInstanceTypeOfferings by AZ);
    instance_types: the types the cluster launches; zones: the region's available AZs;
    wanted: an AZ the user (or the existing subnet) fixed, '' for "choose".
    The first AZ (by name, so a re-run picks the same one) offering every type; ValueError with
    what to change otherwise.
    """
    types = list(dict.fromkeys(t for t in instance_types if t))
    where = f" in {region}" if region else ""
    zones = sorted(dict.fromkeys(zones))
    offered = {t: sorted(set(offerings.get(t) or ()) & set(zones)) for t in types}
    missing = [t for t in types if not offered[t]]
    if missing:
        raise ValueError(
            f"instance type(s) {', '.join(missing)} not offered in any availability zone{where}: "
            "choose other types (dt_master_instance_type / dt_worker_instance_type) or another region "
            "(-e dt_region=...); 'aws ec2 describe-instance-type-offerings --location-type availability-zone' "
            "lists what a region offers."
        )
    if wanted:
        if wanted not in zones:
            raise ValueError(
                f"availability zone {wanted} is not an available zone{where} "
                f"(available: {', '.join(zones)}): pass one of them as -e dt_availability_zone=..., "
                "or leave it unset to have one chosen."
            )
        lacking = [t for t in types if wanted not in offered[t]]
        if lacking:
            good = common_zones(offered, types)
            hint = (
                f"use -e dt_availability_zone={good[0]} (it offers every type), or leave it unset"
                if good
                else "no single zone offers all of them: choose other instance types"
            )
            raise ValueError(
                f"instance type(s) {', '.join(lacking)} not offered in {wanted}: {hint}."
            )
        return wanted
    good = common_zones(offered, types)
    if not good:
        detail = "; ".join(f"{t}: {', '.join(offered[t])}" for t in types)
        raise ValueError(
            f"no availability zone{where} offers every instance type ({detail}): choose instance types "
            "offered in one common zone (dt_master_instance_type / dt_worker_instance_type)."
        )
    return good[0]


def common_zones(offered, types):
    """The zones (sorted) that offer every type of `types`."""
    sets = [set(offered[t]) for t in types]
    return sorted(set.intersection(*sets)) if sets else []


# EC2's vCPU quotas (Service Quotas, service code ec2) by instance class and market. A class is
# the letters before the generation digit of the type (c5.xlarge -> c, g4dn.xlarge -> g).
VCPU_QUOTAS = {
    "standard": {"name": "Standard (A, C, D, H, I, M, R, T, Z)", "on-demand": "L-1216C47A", "spot": "L-34B43A08"},
    "g": {"name": "G and VT", "on-demand": "L-DB2E81BA", "spot": "L-3819A6DF"},
    "p": {"name": "P", "on-demand": "L-417A185B", "spot": "L-7212CCBC"},
}
_CLASS_OF_PREFIX = {"a": "standard", "c": "standard", "d": "standard", "h": "standard", "i": "standard",
                    "m": "standard", "r": "standard", "t": "standard", "z": "standard",
                    "g": "g", "vt": "g", "p": "p"}


def vcpu_class(instance_type):
    """The quota class of an instance type ('standard', 'g', 'p'), or None for one not checked
    here (inf, trn, x, f, u-, dl, ...)."""
    prefix = ""
    for char in (instance_type or "").split(".", 1)[0].lower():
        if char.isdigit():
            break
        prefix += char
    return _CLASS_OF_PREFIX.get(prefix)


def vcpu_needs(requests, vcpus_of, running):
    """{(class, market): {'requested': n, 'running': n, 'types': [...]}} for the classes checked.

    requests: [{'instance_type', 'count', 'market', 'setting'}] the instances this run may launch;
    vcpus_of: {instance type: vCPUs} (DescribeInstanceTypes); running: [{'instance_type', 'market'}]
    the region's pending/running instances that count against the same quotas.
    """
    needs = {}
    for request in requests:
        klass = vcpu_class(request["instance_type"])
        count = int(request["count"])
        if klass is None or count <= 0:
            continue
        need = needs.setdefault((klass, request["market"]), {"requested": 0, "running": 0, "types": []})
        need["requested"] += vcpus_of[request["instance_type"]] * count
        need["types"].append(f"{request.get('setting', 'instance type')}={request['instance_type']} "
                             f"({vcpus_of[request['instance_type']]} vCPUs) x {count}")
    for instance in running:
        key = (vcpu_class(instance["instance_type"]), instance["market"])
        if key in needs:
            needs[key]["running"] += vcpus_of.get(instance["instance_type"], 0)
    return needs


def vcpu_problem(klass, market, need, quota, region=""):
    """'' when the quota covers what is running plus what is requested, else what to change."""
    total = need["requested"] + need["running"]
    if total <= quota:
        return ""
    spec = VCPU_QUOTAS[klass]
    code = spec[market]
    name = (f"Running On-Demand {spec['name']} instances" if market == "on-demand"
            else f"All {spec['name']} Spot Instance Requests")
    where = f" in {region}" if region else ""
    return (
        f"vCPU quota too small{where}: {' + '.join(need['types'])} need {need['requested']} vCPUs, "
        f"{need['running']} are already running, and the quota '{name}' ({code}) is {quota:g}. "
        f"Ask for at least {total} (Service Quotas console, or aws service-quotas "
        f"request-service-quota-increase --service-code ec2 --quota-code {code} --desired-value {total}), "
        "or ask for fewer or smaller instances (worker_count / count, dt_worker_instance_type, "
        "dt_master_instance_type), or stop other instances of that class."
    )


# -- the settings a user types (-e or the inventory), checked before anything is created ----------
# settings_problems() is what every entry point runs first (playbooks/tasks/check_settings.yml);
# script_args() is also the filter that turns dt_train_script_args into the launcher's argument list.

ENGINES = ("mxnet", "torch")
RESIZE_AT = ("step", "epoch")
NODE_IMAGE = ("auto", "plain")
SCRIPT_APIS = ("elastic", "torchrun")   # the runtime's protocol.SCRIPT_APIS
# As roles/cluster/tasks/preflight.yml checks cluster_name (it names every resource and tag).
CLUSTER_RE = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,30}$")
# dt_job_name is a path segment of the S3 prefix and a word of the sync unit's settings.
JOB_NAME_RE = re.compile(r"^[A-Za-z0-9._-]+$")
# S3 bucket naming rules (general purpose buckets).
BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
BUCKET_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
BUCKET_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
# AWS: VPC and subnet blocks from /16 to /28.
AWS_PREFIX_MIN, AWS_PREFIX_MAX = 16, 28
EXAMPLE_ARGS_JSON = '-e \'{"dt_train_script_args": ["--epochs", "20"]}\''
EXAMPLE_ARGS_LINE = "-e 'dt_train_script_args=--epochs 20 --lr 0.1'"

# Whole numbers: name -> (least value, what it is, an example). Unset (None) is not checked: the
# playbooks' defaults apply.
WHOLE_NUMBERS = {
    "worker_count": (0, "base workers besides the master", 1),
    "min_workers": (1, "workers the job keeps, the master counted", 1),
    "max_workers": (1, "workers the job may have, the master counted", 8),
    "count": (1, "workers to add or remove", 2),
    "dt_desired_workers": (0, "workers the job should have, the master counted; 0 keeps the size", 4),
    "dt_warm_pool_size": (0, "stopped, configured workers kept for add_workers; 0 empties the pool", 2),
    "dt_join_timeout": (1, "seconds to wait for the launcher's ADDED", 600),
    "dt_leave_timeout": (1, "seconds to wait for the launcher's REMOVED", 600),
    "dt_master_lost_timeout": (1, "seconds a master may not answer SSH before bootstrap replaces it", 120),
    "dt_root_volume_size": (8, "GiB of each node's root volume", 30),
    "dt_metrics_port": (0, "the port of the launcher's metrics on the master; 0 serves none", 9110),
    "job_timeout": (1, "seconds a job may train", 3600),
    "result_timeout": (1, "seconds until the job's final.json is in S3", 300),
    "job_poll": (1, "seconds between two reads of the job", 10),
    "max_parallel": (1, "rows that run at once in a region", 1),
    "array_timeout": (1, "seconds the whole array may run", 7200),
}
INSTANCE_TYPE_SETTINGS = ("dt_master_instance_type", "dt_worker_instance_type", "dt_bake_instance_type")


def split_args(text):
    """A training script's arguments typed as one shell-like line -> the list of words, split as a
    POSIX shell splits them (quotes group, nothing is expanded); ValueError on an unclosed quote.
    job_array.yml's args column and dt_train_script_args in that form both go through here."""
    return shlex.split(text)


def _list_literal(text):
    """A JSON list (or a Python list literal, as Ansible users also write) in a string, else None."""
    for parse in (json.loads, ast.literal_eval):
        try:
            value = parse(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if isinstance(value, list):
            return value
    return None


def _quoted_whole(text):
    """`text` without its quotes when one pair of quotes encloses all of it, else None."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        try:
            words = shlex.split(text, posix=False)
        except ValueError:
            return None
        if len(words) == 1:
            return text[1:-1]
    return None


def typed_value(name, extra_vars_options):
    """What the user typed after `name=` in the last -e key=value option that starts with it
    (quotes as typed), or None. Ansible's key=value parsing ends a value at its first unquoted
    space: -e 'dt_train_script_args=--epochs 20 --lr 0.1' sets '--epochs' and drops the other words
    (a word with '=', like '--lr=0.1', even becomes a variable of its own); the playbook sees only
    '--epochs'."""
    prefix = f"{name}="
    for option in reversed([str(o).strip() for o in extra_vars_options or ()]):
        if option.startswith(prefix):
            return option[len(prefix):].strip()
    return None


def _kept_by_ansible(typed):
    """The value Ansible's key=value parsing keeps of `typed` (its first word, unquoted)."""
    whole = _quoted_whole(typed)
    if whole is not None:
        return whole
    try:
        words = shlex.split(typed, posix=False)
    except ValueError:
        return None
    return (words[0] if words else "")


def script_args(value, name="dt_train_script_args", typed=None):
    """dt_train_script_args in any form a user types -> the list of strings the script gets.

    A list (YAML/JSON, -e '{"dt_train_script_args": [...]}'); a JSON list in a string
    (-e 'dt_train_script_args=["--epochs","20"]', which Ansible passes as a string); or a
    shell-like line (-e 'dt_train_script_args=--epochs 20 --lr 0.1'), split by split_args().
    typed: typed_value() of the command line's -e options. When the value is the first word of
    what was typed (Ansible cut the line at a space), the whole line typed is taken.
    Numbers become strings; None or '' is no arguments. ValueError says what to type instead.
    """
    if isinstance(value, str) and typed is not None and _kept_by_ansible(typed) == value.strip():
        whole = _quoted_whole(typed)
        value = whole if whole is not None else typed
    if value is None:
        return []
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            items = _list_literal(text)
            if items is None:
                raise ValueError(
                    f"{name}={value} starts with '[' but is not a JSON list: write the list as JSON, "
                    f"e.g. {EXAMPLE_ARGS_JSON} (or -e '{name}=[\"--epochs\",\"20\"]'), or as one line, "
                    f"e.g. {EXAMPLE_ARGS_LINE}."
                )
            value = items
        else:
            try:
                return split_args(text)
            except ValueError as exc:
                raise ValueError(
                    f"{name}={value} cannot be split like a shell line ({exc}): close the quote, "
                    f"e.g. -e \"{name}=--note 'two words'\", or pass a list, e.g. {EXAMPLE_ARGS_JSON}."
                ) from None
    if isinstance(value, (dict, bytes)) or not isinstance(value, (list, tuple)):
        raise ValueError(
            f"{name} is {value!r} ({_kind(value)}): give the script's arguments as a list, "
            f"e.g. {EXAMPLE_ARGS_JSON}, or as one line, e.g. {EXAMPLE_ARGS_LINE}."
        )
    args = []
    for index, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise ValueError(
                f"{name} item {index} is {item!r} ({_kind(item)}): every argument must be a string "
                f"or a number; quote it, e.g. [\"--shuffle\", \"true\"], as in {EXAMPLE_ARGS_JSON}."
            )
        args.append(item if isinstance(item, str) else str(item))
    return args


def _kind(value):
    """A YAML/JSON user's word for the type of `value`."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"a {type(value).__name__}"


def script_args_problem(value, name="dt_train_script_args", typed=None):
    """'' when script_args() takes `value`, else what to type instead."""
    try:
        script_args(value, name, typed)
    except ValueError as exc:
        return str(exc)
    return ""


def whole_number(value, name, least=0, meaning="", example=1):
    """(int, '') for a whole number >= least (an int, an integral float or digits in a string);
    (None, why not and what to pass) otherwise."""
    number = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and re.fullmatch(r"\s*[0-9]+\s*", value):
        number = int(value)
    what = f" ({meaning})" if meaning else ""
    if number is None:
        return None, f"{name}={value} is not valid{what}: give a whole number >= {least}, e.g. -e {name}={example}."
    if number < least:
        return None, f"{name}={value} is not valid{what}: it must be at least {least}, e.g. -e {name}={example}."
    return number, ""


def bucket_name_rule(bucket):
    """'' for a valid S3 bucket name, else which of S3's naming rules it breaks."""
    text = str(bucket)
    if not BUCKET_RE.match(text) or ".." in text:
        return ("an S3 bucket name has 3 to 63 lower-case letters, digits, '.' and '-', beginning and ending "
                "with a letter or digit, without '..'")
    if re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+", text):
        return "an S3 bucket name cannot look like an IP address"
    if text.startswith(BUCKET_PREFIXES) or text.endswith(BUCKET_SUFFIXES):
        return f"S3 reserves the prefixes {', '.join(BUCKET_PREFIXES)} and the suffixes {', '.join(BUCKET_SUFFIXES)}"
    return ""


def bucket_problem(bucket, name="dt_checkpoint_bucket"):
    """'' for a valid S3 bucket name, else what is wrong and what to pass."""
    text = str(bucket)
    why = bucket_name_rule(text)
    if not why:
        return ""
    suggestion = re.sub(r"[^a-z0-9.-]+", "-", text.lower())[:63].strip(".-")
    example = suggestion if not bucket_name_rule(suggestion) else "my-team-checkpoints"
    return (f"{name}={text} is not a valid bucket name: {why}. Pass e.g. -e {name}={example}, or leave it "
            "empty (dynatrain-checkpoints-<account id>).")


def job_name_problem(job, name="dt_job_name"):
    """'' for a job name that can be a segment of the S3 prefix and of the sync unit's settings."""
    text = str(job)
    if JOB_NAME_RE.match(text) and text not in (".", ".."):
        return ""
    example = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or "job"
    return (f"{name}={text!r} is not valid: use only letters, digits, '.', '_' and '-' (it names the job's "
            f"S3 prefix s3://<bucket>/<cluster>/<job>/; a space or '#' would break its copy), e.g. "
            f"-e {name}={example}.")


def resume_from_problem(url, name="resume_from"):
    """'' for an S3 job prefix s3://<bucket>/<cluster>/<job>/ (the trailing '/' optional), else why not."""
    text = str(url).strip()
    how = f"give the job's prefix as status.yml of the old cluster printed it: -e {name}=s3://<bucket>/<cluster>/<job>/"
    match = re.fullmatch(r"s3://([^/]*)/([^/]*)/([^/]*)/?", text)
    if not match:
        return f"{name}={text} is not an S3 job prefix: {how}."
    bucket, cluster, job = match.groups()
    why = bucket_name_rule(bucket)
    if why:
        return f"{name}={text}: the bucket '{bucket}' is not valid ({why}): {how}."
    if not CLUSTER_RE.match(cluster):
        return (f"{name}={text}: '{cluster}' is not a cluster name (a letter, then up to 30 letters, digits "
                f"or '-'): {how}.")
    if job_name_problem(job):
        return (f"{name}={text}: '{job}' is not a job name (letters, digits, '.', '_' and '-'): {how}.")
    return ""


def _network(value, name, example):
    """(IPv4Network, '') or (None, why not and what to pass)."""
    text = str(value).strip()
    try:
        network = ipaddress.IPv4Network(text, strict=False)
    except ValueError:
        return None, f"{name}={text} is not an IPv4 network: pass e.g. -e {name}={example}."
    if "/" not in text:
        return None, f"{name}={text} has no prefix length: pass a network, e.g. -e {name}={example}."
    if str(network) != text:
        return None, f"{name}={text} has host bits set: pass its network, -e {name}={network}."
    if not AWS_PREFIX_MIN <= network.prefixlen <= AWS_PREFIX_MAX:
        large = network.prefixlen < AWS_PREFIX_MIN
        fits = next(network.subnets(new_prefix=AWS_PREFIX_MIN)) if large else network.supernet(new_prefix=AWS_PREFIX_MAX)
        return None, (f"{name}={text} is too {'large' if large else 'small'}: it must be an IPv4 network of "
                      f"/{AWS_PREFIX_MIN} or smaller, down to /{AWS_PREFIX_MAX} (AWS's limits), e.g. -e {name}={fits}.")
    return network, ""


def networks_problem(vpc_cidr, subnet_cidr):
    """'' when dt_vpc_cidr and dt_subnet_cidr are IPv4 networks AWS takes (/16 to /28, no host bits)
    and the subnet lies inside the VPC; else what to pass. Also job_array's first check."""
    vpc, problem = _network(vpc_cidr, "dt_vpc_cidr", "10.77.0.0/16")
    if problem:
        return problem
    inside = str(next(vpc.subnets(new_prefix=min(vpc.prefixlen + 8, AWS_PREFIX_MAX))))
    subnet, problem = _network(subnet_cidr, "dt_subnet_cidr", inside)
    if problem:
        return problem
    if not subnet.subnet_of(vpc):
        return (f"dt_subnet_cidr={subnet} is not inside dt_vpc_cidr={vpc}: pass a subnet of it, "
                f"e.g. -e dt_subnet_cidr={inside}.")
    return ""


def engine_problem(engine, instance_types=None):
    """'' when the engine is known and, for MXNet, has kernels for every GPU instance type given
    ({setting: instance type}); else the reason and what to pass."""
    if engine not in ENGINES:
        return (f"dt_engine={engine} is not an engine: pass -e dt_engine=mxnet (Apache MXNet 1.9.1, the default) "
                "or -e dt_engine=torch (PyTorch).")
    if engine != "mxnet":
        return ""
    problems = []
    for setting, instance_type in (instance_types or {}).items():
        if not instance_type or mxnet_gpu_kernels(instance_type):
            continue
        family = gpu_family(instance_type)
        gpu = f"{family[1]} ({family[0]})" if family else "a GPU newer than H100"
        if family and family[0] in PRE_TURING:
            way_out = "choose an instance type with newer GPUs, e.g. -e {setting}=g5.xlarge (A10G)"
        else:
            way_out = ("pass -e dt_engine=torch (PyTorch's CUDA build runs on H100, H200 and B200), or an instance "
                       "type MXNet has kernels for: p3 (V100), p4d (A100), g5 (A10G), g6 (L4), g6e (L40S)")
        problems.append(
            f"dt_engine=mxnet cannot use {setting}={instance_type}: its GPUs are {gpu}, and MXNet 1.9.1's newest "
            "GPU build (mxnet-cu117) carries kernels for sm_50/60/70/80/86 only, without PTX; "
            + way_out.format(setting=setting) + "."
        )
    return " ".join(problems)


def nvidia_gpus(instance_type):
    """Whether an instance type has NVIDIA GPUs, from the type's name alone (no cloud call): the families of
    gpu_select.GPU_FAMILIES, and every P family (p6e-gb200, p6-b300, ... not in that table yet). EC2 says it too
    (DescribeInstanceTypes' GpuInfo, the inventory's dt_gpu_count), but only after the first cloud call: this
    static table is what the settings check, run before any, has."""
    return gpu_family(instance_type) is not None or bool(re.match(r"^p[0-9]", instance_family(instance_type)))


def mixed_devices_problem(engine, master_type, worker_type):
    """'' unless dt_engine=torch on a master and workers of which one kind has NVIDIA GPUs and the other not.
    Each torch process takes NCCL on a GPU and gloo on the CPU (engines/torch.py), and one process group cannot
    mix them; processes per node ``auto`` (launcher_procs_per_node) would also size every node by the master's
    GPUs (launcher/torchenv.py). An explicit processes-per-node count fixes the second, not the first: the
    cluster is refused whatever the count."""
    if engine != "torch" or not master_type or not worker_type:
        return ""
    types = {"dt_master_instance_type": master_type, "dt_worker_instance_type": worker_type}
    gpus = {setting: nvidia_gpus(instance_type) for setting, instance_type in types.items()}
    if gpus["dt_master_instance_type"] == gpus["dt_worker_instance_type"]:
        return ""

    def said(setting):
        family = gpu_family(types[setting])
        what = (f"{family[1]} GPUs" if family else "NVIDIA GPUs") if gpus[setting] else "no GPU"
        return f"{setting}={types[setting]} ({what})"
    gpu_setting = next(setting for setting in types if gpus[setting])
    cpu_setting = next(setting for setting in types if not gpus[setting])
    return (
        f"dt_engine=torch cannot train on {said('dt_master_instance_type')} with {said('dt_worker_instance_type')}: "
        "a mixed CPU/GPU cluster would form one process group of gloo (CPU) and NCCL (GPU) processes, which cannot "
        "work together, and processes per node auto (launcher_procs_per_node) counts only the master's GPUs for "
        "every node. Give the master and the workers instance types of the same kind: both with GPUs (e.g. "
        f"-e {cpu_setting}={types[gpu_setting]}) or both without (e.g. -e {gpu_setting}={types[cpu_setting]}); "
        "an explicit processes-per-node count (-e launcher_procs_per_node=N) does not make a mixed cluster work.")


def settings_problems(settings, extra_vars=(), typed_names=(), engine_from_cluster=False):
    """Every problem of the settings given ({name: value}; a value of None is not set and not checked),
    each naming the setting, its value and what to type. [] when all is well. extra_vars: the -e
    options as typed (ansible.context.CLIARGS['extra_vars']), for dt_train_script_args' line and
    the words Ansible's key=value parsing would drop; typed_names: the names those -e options set.
    engine_from_cluster: the run takes the engine of the cluster's job when dt_engine is not typed
    (playbooks/tasks/cluster_engine.yml, which checks the engine against the instance types once it
    knows it), so the instance types are checked here only against a dt_engine typed with -e."""
    given = {k: v for k, v in (settings or {}).items() if v is not None}
    problems = []
    numbers = {}
    for name, (least, meaning, example) in WHOLE_NUMBERS.items():
        if name in given:
            numbers[name], problem = whole_number(given[name], name, least, meaning, example)
            if problem:
                problems.append(problem)
    problems += _bounds_problems(numbers)
    if numbers.get("dt_metrics_port") is not None and numbers["dt_metrics_port"] > 65535:
        problems.append(f"dt_metrics_port={given['dt_metrics_port']} is not a port: give one of 1-65535 "
                        "(e.g. -e dt_metrics_port=9110), or 0 to serve no metrics.")
    if "dt_cluster_name" in given and not CLUSTER_RE.match(str(given["dt_cluster_name"])):
        problems.append(
            f"dt_cluster_name={given['dt_cluster_name']} is not valid: use a letter followed by up to 30 letters, "
            "digits or '-' (it names every resource and tag of the cluster), e.g. -e dt_cluster_name=dtcluster.")
    if "dt_train_script_args" in given:
        problems.append(script_args_problem(given["dt_train_script_args"],
                                            typed=typed_value("dt_train_script_args", extra_vars)))
    problems += dropped_words_problems(extra_vars, line_settings=("dt_train_script_args",))
    if "dt_resize_at" in given and given["dt_resize_at"] not in RESIZE_AT:
        problems.append(
            f"dt_resize_at={given['dt_resize_at']} is not valid: pass -e dt_resize_at=step (membership changes at "
            "the next step, the default) or -e dt_resize_at=epoch (at the next epoch, as DT did).")
    if "dt_node_image" in given and given["dt_node_image"] not in NODE_IMAGE:
        problems.append(
            f"dt_node_image={given['dt_node_image']} is not valid: pass -e dt_node_image=auto (boot the baked node "
            "image of the current recipe, baking one beside the job when there is none, the default) or "
            "-e dt_node_image=plain (never bake: boot the base AMI).")
    problems.append(script_api_problem(given.get("dt_train_script_api"), given.get("dt_engine", "mxnet"),
                                       not engine_from_cluster or "dt_engine" in typed_names))
    if "dt_job_name" in given:
        problems.append(job_name_problem(given["dt_job_name"]))
    if given.get("dt_checkpoint_bucket", "") != "":
        problems.append(bucket_problem(given["dt_checkpoint_bucket"]))
    if given.get("resume_from", "") != "":
        problems.append(resume_from_problem(given["resume_from"]))
    if "dt_vpc_cidr" in given and "dt_subnet_cidr" in given:
        problems.append(networks_problem(given["dt_vpc_cidr"], given["dt_subnet_cidr"]))
    gpus = not engine_from_cluster or "dt_engine" in typed_names
    problems.append(engine_problem(given.get("dt_engine", "mxnet"),
                                   {k: given[k] for k in INSTANCE_TYPE_SETTINGS if k in given and gpus}))
    if gpus:
        problems.append(mixed_devices_problem(given.get("dt_engine", "mxnet"), given.get("dt_master_instance_type"),
                                              given.get("dt_worker_instance_type")))
    return [p for p in problems if p]


def script_api_problem(api, engine, engine_known=True):
    """dt_train_script_api: ``elastic`` (the helper API) or ``torchrun`` (a script written for torchrun,
    which only the torch engine runs; checked against dt_engine when the run knows the engine)."""
    if api is None:
        return ""
    if api not in SCRIPT_APIS:
        return (f"dt_train_script_api={api} is not valid: pass -e dt_train_script_api=elastic (the script uses "
                "dynatrain_runtime's Elastic helper, the default) or -e dt_train_script_api=torchrun (a script "
                "written for torchrun, run unchanged: needs dt_engine=torch).")
    if api == "torchrun" and engine_known and engine != "torch":
        return (f"dt_train_script_api=torchrun runs a script written for torchrun, with PyTorch: dt_engine={engine} "
                "cannot run it. Pass -e dt_engine=torch with it, or leave dt_train_script_api out for a script "
                "that uses the Elastic helper.")
    return ""


def dropped_words_problems(extra_vars, line_settings=()):
    """A problem per -e key=value option that holds words Ansible's key=value parsing would drop (or
    turn into variables of their own): a value with an unquoted space. Options that set one of
    line_settings (a line of words by design, see script_args) are left alone."""
    problems = []
    for option in (str(o).strip() for o in extra_vars or ()):
        if not option or option[0] in "@{[" or option.startswith(tuple(f"{n}=" for n in line_settings)):
            continue
        try:
            words = shlex.split(option, posix=False)
        except ValueError:
            continue  # Ansible refuses unbalanced quotes itself
        dropped = [w for w in words if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w)]
        if dropped:
            first = words[0].split("=", 1)
            example = (f"-e '{first[0]}=\"{first[1]} {' '.join(dropped)}\"'" if len(first) == 2
                       else "-e 'name=\"two words\"'")
            problems.append(
                f"-e '{option}': Ansible's key=value form ends a value at a space, so {' '.join(dropped)!r} would be "
                f"dropped (or made a variable of its own): quote a value with spaces inside the -e, e.g. {example}, "
                "or pass JSON, e.g. -e '{\"worker_count\": 2}'.")
    return problems


def _bounds_problems(numbers):
    """The bounds between whole numbers that each passed its own check."""
    top = numbers.get("max_workers")
    if top is None:
        return []
    problems = []
    if numbers.get("min_workers") is not None and numbers["min_workers"] > top:
        problems.append(f"min_workers={numbers['min_workers']} is more than max_workers={top}: pass at most "
                        f"-e min_workers={top}, or raise -e max_workers.")
    if numbers.get("worker_count") is not None and numbers["worker_count"] + 1 > top:
        problems.append(f"worker_count={numbers['worker_count']} is more than max_workers={top} allows (it counts "
                        f"the master too): pass at most -e worker_count={top - 1}, or raise -e max_workers.")
    if numbers.get("dt_desired_workers") is not None and numbers["dt_desired_workers"] > top:
        problems.append(f"dt_desired_workers={numbers['dt_desired_workers']} is more than max_workers={top}: pass "
                        f"at most -e dt_desired_workers={top} (the master counts), or raise -e max_workers.")
    return problems
