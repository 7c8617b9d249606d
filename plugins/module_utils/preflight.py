# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""The pure checks of playbooks/preflight.yml (the one home of each rule; no AWS calls here):

- admin_cidr_problem(): dt_admin_cidr must be an IPv4 network in canonical form (no host bits)
  with a prefix of at least /16 (loopback, the local cloud's 127.0.0.0/8, excepted);
- choose_az(): the availability zone that offers every instance type asked for.

Each returns or raises a message that says what to pass instead.
"""

from __future__ import annotations

import ipaddress

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
