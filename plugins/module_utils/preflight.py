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
