# -*- coding: utf-8 -*-
# Copyright: (c) 2025, dynatrain maintainers
# Apache License 2.0 (see galaxy.yml)

from __future__ import annotations

DOCUMENTATION = r"""
name: ec2_elastic
short_description: EC2 inventory of dynatrain elastic MXNet training clusters
version_added: 0.1.0
author:
  - dynatrain maintainers (@dynatrain)
description:
  - Builds an inventory of the EC2 instances of one or more dynatrain training clusters,
    in one or more regions, grouped by role, elastic-worker tag, elastic_worker_status,
    lifecycle (spot / on-demand) and cluster.
  - An instance belongs to cluster C when it carries the tag C(dynatrain:cluster=C).
    Its role comes from the tag C(dynatrain:role) (V(master) or V(worker)); the
    Dynamic Training tag C(NodeType=Master|Worker) is accepted as a fallback, and a node
    carrying the elastic-worker tag and no role tag is a worker.
  - "Groups: C(dt_master); C(dt_workers) (every node that runs a worker process, the master
    included: every node whose role is master or worker); C(dt_base) (role worker, no
    elastic-worker tag); C(dt_elastic) (nodes carrying the tag C(<C>-aws-dl-cfn-elastic-worker));
    C(dt_status_add_queued), C(dt_status_added), C(dt_status_removal_queued),
    C(dt_status_removed), C(dt_status_add_failed) (from the tag C(elastic_worker_status));
    C(dt_spot); C(dt_pool) (the cluster's warm pool: workers kept configured and stopped, tag
    C(dynatrain:group=pool); they are in no other fixed group, since they run no worker process);
    C(dt_cluster_<C>) (C with every character outside C([A-Za-z0-9_]) replaced by
    C(_)). The fixed groups always exist, even when empty, so that playbooks can target them."
  - "Host variables: C(dt_instance_id), C(dt_private_ip), C(dt_public_ip), C(dt_cluster),
    C(dt_role) (V(master), V(worker) or null), C(dt_status) (the elastic_worker_status tag or null),
    C(dt_lifecycle) (V(spot) or V(on-demand)), C(dt_instance_type), C(dt_gpu_count),
    C(dt_region), C(dt_launch_time) (ISO 8601 string), C(dt_tags) (all tags as a dict),
    C(dt_elastic) (bool), C(dt_pool) (bool: in the warm pool), C(dt_efs_id) (the cluster's shared file
    system, tag C(dynatrain:efs) that the launch templates put on their instances, or null), and C(dt_state), C(dt_availability_zone), C(dt_private_dns_name),
    C(dt_public_dns_name), C(dt_vpc_id), C(dt_subnet_id), C(dt_image_id), C(dt_key_name).
    Tags are exposed only under C(dt_tags), never as plain C(tags)."
  - Each region costs one paginated C(DescribeInstances) call with server-side filters (the cluster
    tag and the instance states V(pending), V(running), V(stopping), V(stopped)) and at most one
    batched C(DescribeInstanceTypes) call for the instance types not yet known in this process;
    regions are queried concurrently. There is no per-instance API call. Terminated and
    shutting-down instances are always left out.
  - C(dt_gpu_count) is the GPU count C(DescribeInstanceTypes) reports, 0 for types without GPUs.
    An instance type the API does not know gives 0 and a warning, never a failure.
  - The configuration file must be a YAML file whose name ends in C(ec2_elastic.yml) or
    C(ec2_elastic.yaml), for example C(inventories/aws/aws.ec2_elastic.yml).
  - Unknown options in the configuration file are an error (with a suggestion), not silently ignored.
notes:
  - Credentials, O(region), O(endpoint_url) and O(assume_role_arn) are handled as in the
    P(amazon.aws.aws_ec2#inventory) inventory plugin (same options, same base class). Without
    O(access_key) and O(profile), boto3 looks credentials up in its usual order (environment,
    shared credentials/config files, container or instance role).
  - "Keys and a profile from different places: the ones in the configuration file win over the
    ones from the environment (C(AWS_ACCESS_KEY_ID), C(AWS_PROFILE)); both in the configuration
    file is an error. O(access_key) and O(secret_key) must be set together."
  - When O(endpoint_url) is not set, botocore's own C(AWS_ENDPOINT_URL_EC2) and C(AWS_ENDPOINT_URL)
    environment variables and C(endpoint_url) config-file settings apply. O(endpoint_url) is used
    for STS (O(assume_role_arn)) too.
  - O(assume_role_arn) is assumed (in O(region), else the first of O(regions)) only when the API is
    queried, so that a cached run makes no API call at all.
  - "Caching is off by default; with O(cache=true) only the raw API results are cached
    (instances and the GPU counts of their types), so a cached run makes no API call, while
    C(meta: refresh_inventory) or C(--flush-cache) queries again."
extends_documentation_fragment:
  - constructed
  - inventory_cache
  - amazon.aws.boto3
  - amazon.aws.common.plugins
  - amazon.aws.region.plugins
  - amazon.aws.assume_role.plugins
options:
  plugin:
    description: Marks this file as a configuration of this plugin.
    required: true
    type: str
    choices: ['dynatrain.elastic.ec2_elastic', 'ec2_elastic']
  regions:
    description:
      - Regions to query; several regions are queried concurrently.
      - When empty, only O(region) is queried (C(AWS_REGION), else C(AWS_DEFAULT_REGION) or the
        profile's region); it is an error when there is none. Unlike P(amazon.aws.aws_ec2#inventory),
        an empty list never means every region; empty entries (a template that gave V('')) are dropped.
      - "Entries may be templates. With O(use_extra_vars=true) every templated option also sees the
        command line's extra vars, so C(regions: ['{{ dt_region | default(\"\") }}']) follows
        C(-e dt_region=us-west-2), and falls back to O(region) when it is not given."
    type: list
    elements: str
    default: []
  clusters:
    description:
      - Names of the clusters (values of the C(dynatrain:cluster) tag) to include.
      - When empty, every instance that carries a C(dynatrain:cluster) tag is included.
    type: list
    elements: str
    default: []
  filters:
    description:
      - Extra C(DescribeInstances) filters, as a dict of filter name to value or list of values,
        added to every query (see
        U(https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeInstances.html)).
      - A C(instance-state-name) filter replaces the default states; terminated and
        shutting-down instances are still left out.
    type: dict
    default: {}
  include_filters:
    description:
      - A list of filter dicts; an instance matching any of them (and O(filters)) is included.
      - Each entry costs one more C(DescribeInstances) call per region; keep the list short.
    type: list
    elements: dict
    default: []
  exclude_filters:
    description:
      - A list of filter dicts; an instance matching any of them is left out. Takes priority
        over O(filters) and O(include_filters).
      - Each entry costs one more C(DescribeInstances) call per region.
    type: list
    elements: dict
    default: []
  hostnames:
    description:
      - Inventory host name, in order of preference; the first one the instance has is used.
      - "One of V(private-ip-address), V(instance-id), V(ip-address) (alias V(public-ip-address)),
        V(dns-name) (alias V(public-dns-name)), V(private-dns-name), V(ipv6-address), or
        V(tag:KEY) for the value of tag KEY (for example V(tag:Name))."
      - When the chosen name is already used by another instance (for example the same private
        address in two regions), the next preference is tried, with a warning; the instance id
        is the last resort.
    type: list
    elements: str
    default: ['private-ip-address', 'instance-id']
  gpu_counts:
    description:
      - GPU counts by instance type that override (and skip) the C(DescribeInstanceTypes) lookup,
        for example for types an API emulator does not know.
    type: dict
    default: {}
  strict_permissions:
    description:
      - When V(true), an access-denied answer (C(UnauthorizedOperation)) from a region is an error.
      - When V(false), that region is skipped with a warning.
    type: bool
    default: true
  validate_certs:
    description:
      - V(false) turns off the verification of the endpoint's TLS certificate.
      - When not set, certificates are verified, against C(AWS_CA_BUNDLE) (or the profile's
        C(ca_bundle)) when that is set.
    type: bool
"""

EXAMPLES = r"""
# inventories/local/localcloud.ec2_elastic.yml - the embedded local cloud
plugin: dynatrain.elastic.ec2_elastic
regions:
  - us-east-1
endpoint_url: http://127.0.0.1:4599
access_key: localcloud
secret_key: localcloud
hostnames:
  - private-ip-address
compose:
  ansible_host: dt_private_ip

---
# aws.ec2_elastic.yml - two clusters in two regions, public addresses, cached for 5 minutes
plugin: dynatrain.elastic.ec2_elastic
regions:
  - us-east-1
  - eu-west-1
clusters:
  - mnist
  - resnet-50
profile: training
hostnames:
  - tag:Name
  - private-ip-address
compose:
  ansible_host: dt_public_ip | default(dt_private_ip, true)
keyed_groups:
  - key: dt_region
    prefix: region
  - key: dt_instance_type
    prefix: type
groups:
  gpu_nodes: dt_gpu_count > 0
cache: true
cache_plugin: ansible.builtin.jsonfile
cache_connection: ~/.cache/dynatrain-inventory
cache_timeout: 300

---
# Only running nodes, without the ones being removed, in an account that cannot read every region
plugin: dynatrain.elastic.ec2_elastic
regions: [us-east-1, us-west-2, ap-northeast-1]
assume_role_arn: arn:aws:iam::123456789012:role/dynatrain-inventory
strict_permissions: false
filters:
  instance-state-name: running
exclude_filters:
  - tag:elastic_worker_status: [REMOVAL_QUEUED, REMOVED]
gpu_counts:
  p3.2xlarge: 1

---
# The region of the environment or profile (AWS_REGION, AWS_DEFAULT_REGION); keys may be templates
plugin: dynatrain.elastic.ec2_elastic
access_key: "{{ lookup('ansible.builtin.env', 'DT_AWS_KEY') }}"
secret_key: "{{ lookup('ansible.builtin.env', 'DT_AWS_SECRET') }}"

---
# The region of -e dt_region=..., else AWS_REGION / AWS_DEFAULT_REGION / the profile's region
plugin: dynatrain.elastic.ec2_elastic
use_extra_vars: true
regions:
  - "{{ dt_region | default('') }}"

---
# In a playbook: pick up instances launched by an earlier play
# - name: Launch workers
#   ...
# - name: Re-read the EC2 inventory
#   ansible.builtin.meta: refresh_inventory
"""

import concurrent.futures
import dataclasses
import datetime
import difflib
import functools
import re
import threading

try:
    import botocore.config
    import botocore.exceptions
    import botocore.loaders
    import botocore.regions
except ImportError:
    pass  # HAS_BOTO3 tells

from ansible import constants as C
from ansible.errors import AnsibleError
from ansible.errors import AnsibleParserError
from ansible.module_utils.common.text.converters import to_native
from ansible.utils.display import Display

from ansible_collections.amazon.aws.plugins.module_utils.botocore import HAS_BOTO3
from ansible_collections.amazon.aws.plugins.plugin_utils.inventory import AWSInventoryBase

from ansible_collections.dynatrain.elastic.plugins.module_utils import tags as cluster_tags
from ansible_collections.dynatrain.elastic.plugins.plugin_utils.aws_client import SharedLoaderClient

display = Display()

# The tag names: their one home is module_utils/tags.py.
CLUSTER_TAG = cluster_tags.CLUSTER
ROLE_TAG = cluster_tags.ROLE
NODE_TYPE_TAG = cluster_tags.NODE_TYPE
STATUS_TAG = cluster_tags.STATUS
GROUP_TAG = cluster_tags.GROUP
# the cluster's shared file system, put on its instances by the launch templates
EFS_TAG = cluster_tags.EFS
POOL_GROUP = "pool"  # GROUP_TAG's value on a warm-pool worker (roles/cluster: warm_pool)
ELASTIC_TAG_SUFFIX = cluster_tags.ELASTIC_SUFFIX
STATUSES = ("ADD_QUEUED", "ADDED", "REMOVAL_QUEUED", "REMOVED", "ADD_FAILED")
LIVE_STATES = ("pending", "running", "stopping", "stopped")
FIXED_GROUPS = (
    "dt_master",
    "dt_workers",
    "dt_base",
    "dt_elastic",
    "dt_spot",
    "dt_pool",
) + tuple("dt_status_" + s.lower() for s in STATUSES)

# hostnames preference -> instance attribute
HOSTNAME_ATTRIBUTES = {
    "private-ip-address": "PrivateIpAddress",
    "instance-id": "InstanceId",
    "ip-address": "PublicIpAddress",
    "public-ip-address": "PublicIpAddress",
    "dns-name": "PublicDnsName",
    "public-dns-name": "PublicDnsName",
    "private-dns-name": "PrivateDnsName",
}
HOSTNAME_SPECIAL = ("ipv6-address", "tag:KEY")

# The parts of a DescribeInstances answer the plugin reads; this is what is cached.
INSTANCE_KEYS = (
    "InstanceId",
    "InstanceType",
    "State",
    "Tags",
    "PrivateIpAddress",
    "PublicIpAddress",
    "PrivateDnsName",
    "PublicDnsName",
    "LaunchTime",
    "InstanceLifecycle",
    "SpotInstanceRequestId",
    "Placement",
    "VpcId",
    "SubnetId",
    "ImageId",
    "KeyName",
    "Ipv6Address",
)

TYPES_PER_CALL = 100  # DescribeInstanceTypes accepts at most 100 InstanceTypes
CACHE_FORMAT = 1
DENIED_CODES = ("UnauthorizedOperation", "AccessDenied", "AccessDeniedException", "OptInRequired")
BAD_CREDENTIAL_CODES = (
    "AuthFailure",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "UnrecognizedClientException",
    "RequestExpired",
    "ExpiredToken",
)
CREDENTIALS_HINT = (
    "set access_key and secret_key (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), "
    "or profile (AWS_PROFILE), or run where an instance or container role is available"
)
# Options that may be templates (e.g. a lookup for a secret): amazon.aws's, plus ours.
TEMPLATABLE = AWSInventoryBase.TemplatedOptions.TEMPLATABLE_OPTIONS + ("clusters",)
KEY_OPTIONS = ("access_key", "secret_key", "session_token")
# The options the cached answer depends on, besides the config file's path.
SIGNATURE_OPTIONS = (
    "regions",
    "region",
    "clusters",
    "filters",
    "include_filters",
    "exclude_filters",
    "endpoint_url",
    "assume_role_arn",
)


# ---------------------------------------------------------------------------
# Pure functions (unit-tested directly)
# ---------------------------------------------------------------------------


def tags_to_dict(tag_list):
    """[{'Key': k, 'Value': v}, ...] -> {k: v}"""
    return {t["Key"]: t.get("Value", "") for t in tag_list or ()}


def sanitize_group_part(name):
    """Group-name-safe form of a cluster name: every char outside [A-Za-z0-9_] becomes '_'."""
    return re.sub(r"[^A-Za-z0-9_]", "_", str(name))


def cluster_group(cluster):
    return "dt_cluster_" + sanitize_group_part(cluster)


def elastic_tag_key(cluster):
    """The tag that marks an elastic worker of `cluster` (DT's console workflow)."""
    return cluster_tags.elastic_tag(cluster)


def node_role(tags, elastic=False):
    """master | worker | None, from dynatrain:role, else NodeType, else the elastic-worker tag."""
    role = (tags.get(ROLE_TAG) or "").strip().lower()
    if role in ("master", "worker"):
        return role
    node_type = (tags.get(NODE_TYPE_TAG) or "").strip().lower()
    if node_type in ("master", "worker"):
        return node_type
    return "worker" if elastic else None


def iso_time(value):
    """LaunchTime as an ISO 8601 string (boto3 gives datetime, a cache gives a string)."""
    if value is None:
        return None
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return value.isoformat()
    return str(value)


def json_safe(value):
    """Datetimes -> ISO strings, recursively, so that fresh and cached results are identical."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, datetime.datetime):
        return iso_time(value)
    return value


def trim_instance(instance):
    """Keep the parts of a DescribeInstances instance the plugin reads (JSON-safe)."""
    kept = {k: instance[k] for k in INSTANCE_KEYS if k in instance}
    ipv6 = [
        a["Ipv6Address"]
        for ni in instance.get("NetworkInterfaces") or ()
        for a in ni.get("Ipv6Addresses") or ()
        if a.get("Ipv6Address")
    ]
    if ipv6 and "Ipv6Address" not in kept:
        kept["Ipv6Address"] = ipv6[0]
    return json_safe(kept)


def region_of_zone(zone):
    """us-east-1a -> us-east-1 (local zones us-west-2-lax-1a -> us-west-2-lax-1)."""
    return zone[:-1] if zone else None


def host_vars(instance, region, gpu_count):
    """The dt_* host variables of one (trimmed or raw) DescribeInstances instance."""
    tags = tags_to_dict(instance.get("Tags"))
    cluster = tags.get(CLUSTER_TAG)
    elastic = bool(cluster) and elastic_tag_key(cluster) in tags
    status = tags.get(STATUS_TAG)
    placement = instance.get("Placement") or {}
    zone = placement.get("AvailabilityZone")
    return {
        "dt_instance_id": instance["InstanceId"],
        "dt_private_ip": instance.get("PrivateIpAddress") or None,
        "dt_public_ip": instance.get("PublicIpAddress") or None,
        "dt_cluster": cluster,
        "dt_role": node_role(tags, elastic),
        "dt_status": status.strip().upper() if status else None,
        "dt_lifecycle": "spot" if instance.get("InstanceLifecycle") == "spot" else "on-demand",
        "dt_instance_type": instance.get("InstanceType"),
        "dt_gpu_count": int(gpu_count or 0),
        "dt_region": region or region_of_zone(zone),
        "dt_launch_time": iso_time(instance.get("LaunchTime")),
        "dt_tags": tags,
        "dt_elastic": elastic,
        "dt_pool": bool(cluster) and tags.get(GROUP_TAG) == POOL_GROUP,
        "dt_efs_id": tags.get(EFS_TAG) or None,
        "dt_state": (instance.get("State") or {}).get("Name"),
        "dt_availability_zone": zone,
        "dt_private_dns_name": instance.get("PrivateDnsName") or None,
        "dt_public_dns_name": instance.get("PublicDnsName") or None,
        "dt_vpc_id": instance.get("VpcId"),
        "dt_subnet_id": instance.get("SubnetId"),
        "dt_image_id": instance.get("ImageId"),
        "dt_key_name": instance.get("KeyName"),
    }


def host_groups(hostvars):
    """The dt_* groups a host with these host vars belongs to."""
    groups = []
    if hostvars.get("dt_cluster"):
        groups.append(cluster_group(hostvars["dt_cluster"]))
    if hostvars.get("dt_pool"):
        # a warm-pool worker (stopped, or being filled) runs no worker process: in no other group
        return groups + ["dt_pool"]
    role = hostvars.get("dt_role")
    if role == "master":
        groups += ["dt_master", "dt_workers"]
    elif role == "worker":
        groups.append("dt_workers")
        if not hostvars.get("dt_elastic"):
            groups.append("dt_base")
    if hostvars.get("dt_elastic"):
        groups.append("dt_elastic")
    status = hostvars.get("dt_status")
    if status in STATUSES:
        groups.append("dt_status_" + status.lower())
    if hostvars.get("dt_lifecycle") == "spot":
        groups.append("dt_spot")
    return groups


def check_hostnames(preferences):
    """Raise ValueError naming the bad entry when a hostnames preference is not supported."""
    if not isinstance(preferences, (list, tuple)) or not preferences:
        raise ValueError("hostnames must be a non-empty list")
    for pref in preferences:
        if not isinstance(pref, str):
            raise ValueError(f"hostnames entries must be strings, got {pref!r}")
        if pref in HOSTNAME_ATTRIBUTES or pref == "ipv6-address":
            continue
        if pref.startswith("tag:") and len(pref) > 4:
            continue
        known = sorted(HOSTNAME_ATTRIBUTES) + list(HOSTNAME_SPECIAL)
        close = difflib.get_close_matches(pref, known, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ValueError(f"unsupported hostnames entry '{pref}'.{hint} Supported: {', '.join(known)}.")


def hostname_candidates(instance, preferences):
    """The names an instance could have, in order of preference (missing ones skipped)."""
    names = []
    tags = None
    for pref in preferences:
        if pref.startswith("tag:"):
            if tags is None:
                tags = tags_to_dict(instance.get("Tags"))
            value = tags.get(pref[4:])
        elif pref == "ipv6-address":
            value = instance.get("Ipv6Address")
        else:
            value = instance.get(HOSTNAME_ATTRIBUTES.get(pref, ""))
        if value and value not in names:
            names.append(str(value))
    return names


def choose_hostname(instance, preferences, used):
    """First candidate not used by another instance; instance id as the last resort.

    Returns (name, skipped) where skipped lists the candidates taken by others."""
    instance_id = instance["InstanceId"]
    skipped = []
    for name in hostname_candidates(instance, preferences):
        owner = used.get(name)
        if owner is None or owner == instance_id:
            return name, skipped
        skipped.append(name)
    return instance_id, skipped


def to_boto_filters(filters):
    """{'tag:Name': 'x', 'instance-type': ['a', 'b']} -> [{'Name': ..., 'Values': [...]}]"""
    result = []
    for name, values in (filters or {}).items():
        if not isinstance(values, (list, tuple)):
            values = [values]
        result.append({"Name": str(name), "Values": [str(v) for v in values]})
    return result


def base_filters(clusters, filters):
    """Server-side filters of every query: cluster tag, live states, then the user's filters."""
    merged = {}
    if clusters:
        merged["tag:" + CLUSTER_TAG] = list(clusters)
    else:
        merged["tag-key"] = [CLUSTER_TAG]
    merged["instance-state-name"] = list(LIVE_STATES)
    for name, value in (filters or {}).items():
        if name == "tag-key" and "tag-key" in merged and not clusters:
            # tag-key values are OR-ed by EC2: keep the cluster-tag condition separate
            merged["tag:" + CLUSTER_TAG] = ["*"]
            del merged["tag-key"]
        merged[name] = value
    return to_boto_filters(merged)


def query_plan(clusters, filters, include_filters, exclude_filters):
    """(include filter lists, exclude filter lists) - one DescribeInstances call per list."""
    includes = [base_filters(clusters, dict(filters or {}, **f)) for f in include_filters or ()]
    if not includes:
        includes = [base_filters(clusters, filters)]
    excludes = [base_filters(clusters, f) for f in exclude_filters or ()]
    return includes, excludes


def gpu_count_of(type_info):
    """GPU count from one DescribeInstanceTypes entry (0 without GpuInfo)."""
    gpu_info = type_info.get("GpuInfo") or {}
    return sum(int(g.get("Count") or 0) for g in gpu_info.get("Gpus") or ())


def invalid_types_in(message, asked):
    """Instance types named in an InvalidInstanceType message, restricted to those asked for."""
    found = set(re.findall(r"[A-Za-z0-9-]+\.[A-Za-z0-9-]+", message or ""))
    return sorted(found & set(asked))


def error_code(exc):
    return (getattr(exc, "response", None) or {}).get("Error", {}).get("Code", "")


def keep_instance(instance, clusters):
    """Client-side guard for what the server-side filters should already have done."""
    if (instance.get("State") or {}).get("Name") not in LIVE_STATES:
        return False
    cluster = tags_to_dict(instance.get("Tags")).get(CLUSTER_TAG)
    if not cluster:
        return False
    return not clusters or cluster in clusters


def check_regions(regions, known):
    """Raise ValueError naming the first of `regions` not in `known`, with a suggestion."""
    for region in regions:
        if region not in known:
            close = difflib.get_close_matches(region, sorted(known), n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise ValueError(
                f"unknown region '{region}' in 'regions'.{hint} "
                "(A region newer than this botocore needs a botocore upgrade.)"
            )


@functools.lru_cache(maxsize=1)
def known_ec2_regions():
    """Every EC2 region this botocore knows, in every partition (read once per process; from
    botocore's data files alone, not a session, which could fail on a bad AWS_PROFILE)."""
    resolver = botocore.regions.EndpointResolver(botocore.loaders.create_loader().load_data("endpoints"))
    return frozenset(
        region
        for partition in resolver.get_available_partitions()
        for region in resolver.get_available_endpoints("ec2", partition_name=partition)
    )


def client_config():
    """botocore settings of the EC2 clients (merged by amazon.aws with its user agent)."""
    return botocore.config.Config(
        retries={"mode": "standard", "max_attempts": 3},
        connect_timeout=10,
        read_timeout=300,
        user_agent_extra="dynatrain.elastic.ec2_elastic",
    )


# ---------------------------------------------------------------------------
# Plugin
# ---------------------------------------------------------------------------


class _RegionSkipped(Exception):
    """A region that strict_permissions: false lets us skip."""


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What every region is asked (read in the main thread, used by the region threads)."""

    includes: list
    excludes: list
    clusters: list
    gpu_overrides: dict
    strict: bool


class InventoryModule(AWSInventoryBase, SharedLoaderClient):
    """amazon.aws's AWSInventoryBase gives the AWS options, credentials, clients, assume-role,
    the default region and the cache helpers; this class adds the dt_* query and inventory. Its clients are made
    on the process's one botocore loader (SharedLoaderClient), which every task's fork inherits."""

    NAME = "dynatrain.elastic.ec2_elastic"
    INVENTORY_FILE_SUFFIXES = ("ec2_elastic.yml", "ec2_elastic.yaml")

    # GPU counts by (endpoint, region, instance type), shared by every parse in this process
    # (refresh_inventory): instance types do not change. None = unknown to the API.
    _gpu_memo = {}
    _gpu_memo_lock = threading.Lock()

    class TemplatedOptions(AWSInventoryBase.TemplatedOptions):
        """amazon.aws's, plus `clusters`, without passing `disable_lookups` to the templar (every
        list option would print a deprecation warning on ansible-core 2.19)."""

        TEMPLATABLE_OPTIONS = TEMPLATABLE

        def get(self, *args):
            value = self.original_options.get(*args)
            if not value or not self.templar or args[0] not in self.TEMPLATABLE_OPTIONS:
                return value
            return self._template(value)

        def _template(self, value):
            if isinstance(value, dict):
                return {k: self._template(v) for k, v in value.items()}
            if isinstance(value, list):
                return [self._template(v) for v in value]
            if isinstance(value, str) and self.templar.is_template(value):
                return self.templar.template(value)
            return value

    def __init__(self):
        super().__init__()
        self._warnings = []

    # -- templated options: with use_extra_vars, they see the -e variables -----

    def _options_templar(self):
        """The templar for templated options: with O(use_extra_vars), one that also sees the
        command line's extra vars (e.g. C(regions: ['{{ dt_region }}']) follows C(-e dt_region=...))."""
        extra = getattr(self, "_vars", None)
        if extra and self._use_extra_vars():
            return self.templar.copy_with_new_env(available_variables=extra)
        return self.templar

    def _use_extra_vars(self):
        try:
            return bool(super(AWSInventoryBase, self).get_option("use_extra_vars"))
        except KeyError:
            return False

    def get_options(self, *args):
        return self.TemplatedOptions(self._options_templar(), super(AWSInventoryBase, self).get_options(*args))

    def get_option(self, option, hostvars=None):
        raw = super(AWSInventoryBase, self).get_option(option, hostvars)
        return self.TemplatedOptions(self._options_templar(), {option: raw}).get(option)

    # -- config ------------------------------------------------------------

    def verify_file(self, path):
        if super().verify_file(path):
            return True
        if path.endswith((".yml", ".yaml")) and not path.endswith(self.INVENTORY_FILE_SUFFIXES):
            if self._names_this_plugin(path):
                display.warning(
                    f"{path} configures {self.NAME} but is ignored: the file name must end in "
                    f"'ec2_elastic.yml' or 'ec2_elastic.yaml' (rename it, e.g. to 'aws.ec2_elastic.yml')."
                )
        return False

    def _names_this_plugin(self, path):
        try:
            with open(path, "r", encoding="utf-8") as handle:
                text = handle.read(65536)
        except (OSError, UnicodeDecodeError):
            return False
        return re.search(r"^plugin:\s*['\"]?(dynatrain\.elastic\.)?ec2_elastic['\"]?\s*$", text, re.M) is not None

    def _read_config_data(self, path):
        """The base class's parse() reads the file here: check the options and settle the
        credentials before anything uses them."""
        config = super()._read_config_data(path)
        self._check_unknown_options(config, path)
        self._resolve_credentials()
        return config

    def _check_unknown_options(self, config, path):
        definitions = C.config.get_configuration_definitions("inventory", self._load_name) or {}
        known = set(definitions)
        for definition in definitions.values():
            known.update(definition.get("aliases") or ())
        unknown = sorted(str(k) for k in config if k not in known)
        if not unknown:
            return
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hints.append(f"'{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
        raise AnsibleParserError(
            f"{path}: unknown option(s) for {self.NAME}: {', '.join(hints)}. "
            f"See 'ansible-doc -t inventory {self.NAME}' for the options."
        )

    def _in_file(self, name):
        """True when option `name` was set in the config file (not from the environment)."""
        return str(self._origins.get(name, "")).lower() == "direct"

    def _resolve_credentials(self):
        """Keys and a profile: the config file beats the environment (amazon.aws refuses both)."""
        key, secret = self.get_option("access_key"), self.get_option("secret_key")
        profile = self.get_option("profile")
        keys_in_file = self._in_file("access_key") or self._in_file("secret_key")
        if profile and (key or secret or self.get_option("session_token")):
            if keys_in_file and self._in_file("profile"):
                raise AnsibleParserError(
                    f"{self.NAME}: profile and access_key/secret_key are mutually exclusive; "
                    "set only one of them in the config file."
                )
            if self._in_file("profile") or not keys_in_file and not (key and secret):
                for name in KEY_OPTIONS:
                    self.set_option(name, "")  # (None would fall back to the environment again)
                key = secret = None
            else:
                self.set_option("profile", "")
        if bool(key) != bool(secret):
            raise AnsibleParserError(
                f"{self.NAME}: access_key and secret_key must be set together "
                "(one of them is missing from the config file or the environment)."
            )

    # -- amazon.aws hooks ------------------------------------------------------

    def _do_fail(self, message):
        raise AnsibleParserError(f"{self.NAME}: {message}")

    def fail_aws(self, message, exception=None):
        if isinstance(exception, botocore.exceptions.ProfileNotFound):
            message = (
                f"AWS profile '{exception.kwargs.get('profile')}' not found; "
                "check the profile option / AWS_PROFILE and ~/.aws/config"
            )
        super().fail_aws(message, exception=exception)

    def _set_frozen_credentials(self):
        """Called by the base class's parse(); the role is assumed in _query() instead, so that
        a cached run makes no API call."""

    def _freeze_iam_role(self, iam_role_arn):
        if not self.region and self.get_option("regions"):
            self.set_option("region", self.get_option("regions")[0])  # STS needs a region
        try:
            super()._freeze_iam_role(iam_role_arn)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            raise AnsibleParserError(
                f"{self.NAME}: could not assume role {iam_role_arn}: {to_native(e)}; check assume_role_arn and that "
                "the base credentials may call sts:AssumeRole on it."
            )

    # -- warnings (collected in the region threads, shown once each) ------------

    def _warn(self, message):
        self._warnings.append(message)

    def _flush_warnings(self):
        for message in dict.fromkeys(self._warnings):
            self.warn(message)
        self._warnings = []

    # -- regions and errors --------------------------------------------------

    def _regions(self):
        """The regions option, checked; else the base class's region (region, AWS_REGION, profile)."""
        regions = list(dict.fromkeys(r for r in self.get_option("regions") or () if r))
        if not regions:
            if self.region:
                return [self.region]
            raise AnsibleParserError(
                f"{self.NAME}: no region to query; set 'regions' in the config file "
                "(or region, AWS_REGION, AWS_DEFAULT_REGION)."
            )
        try:
            check_regions(regions, known_ec2_regions())
        except ValueError as e:
            raise AnsibleParserError(f"{self.NAME}: {e}")
        return regions

    def _api_error(self, exc, region, client, action, strict):
        """AnsibleParserError (or _RegionSkipped) that says what to fix."""
        endpoint = getattr(getattr(client, "meta", None), "endpoint_url", None) or "the default endpoint"
        if isinstance(exc, botocore.exceptions.NoCredentialsError):
            return AnsibleParserError(f"{self.NAME}: no AWS credentials found; {CREDENTIALS_HINT}.")
        if isinstance(exc, (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectionError)):
            return AnsibleParserError(
                f"{self.NAME}: could not connect to the EC2 API at {endpoint} (region {region}): {to_native(exc)}. "
                "Check endpoint_url (or AWS_ENDPOINT_URL) and that the service is up "
                "(for the local cloud: python -m localcloud up)."
            )
        code = error_code(exc)
        if code in DENIED_CODES and not strict:
            return _RegionSkipped(f"{self.NAME}: skipping region {region}: {action} was denied ({code}).")
        if code in DENIED_CODES:
            return AnsibleParserError(
                f"{self.NAME}: not allowed to call {action} in region {region} ({code}). Grant "
                "ec2:DescribeInstances and ec2:DescribeInstanceTypes, or set strict_permissions: false "
                "to skip regions you cannot read."
            )
        if code in BAD_CREDENTIAL_CODES:
            return AnsibleParserError(
                f"{self.NAME}: the AWS credentials were rejected in region {region} ({code}: "
                f"{to_native(exc)}); {CREDENTIALS_HINT}."
            )
        return AnsibleParserError(f"{self.NAME}: {action} failed in region {region} at {endpoint}: {to_native(exc)}")

    # -- queries ---------------------------------------------------------------

    def _describe(self, client, filters):
        paginator = client.get_paginator("describe_instances")
        for page in paginator.paginate(Filters=filters):
            for reservation in page.get("Reservations") or ():
                yield from reservation.get("Instances") or ()

    def _query_region(self, client, region, plan):
        """Raw results of one region: {'instances': [...], 'gpus': {type: count or None}}."""
        try:
            excluded = set()
            for filters in plan.excludes:
                excluded.update(i["InstanceId"] for i in self._describe(client, filters))
            found = {}
            for filters in plan.includes:
                for instance in self._describe(client, filters):
                    iid = instance["InstanceId"]
                    if iid not in excluded and iid not in found and keep_instance(instance, plan.clusters):
                        found[iid] = trim_instance(instance)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            raise self._api_error(e, region, client, "ec2:DescribeInstances", plan.strict)
        instances = [found[k] for k in sorted(found)]
        types = sorted({i.get("InstanceType") for i in instances if i.get("InstanceType")} - set(plan.gpu_overrides))
        return {"instances": instances, "gpus": self._gpu_counts(client, region, types)}

    def _gpu_counts(self, client, region, types):
        """GPU count per type (None = unknown to the API), batched, memoised per process."""
        endpoint = getattr(client.meta, "endpoint_url", "")
        result = {}
        with self._gpu_memo_lock:
            for t in types:
                key = (endpoint, region, t)
                if key in self._gpu_memo:
                    result[t] = self._gpu_memo[key]
        todo = [t for t in types if t not in result]
        for start in range(0, len(todo), TYPES_PER_CALL):
            batch = todo[start:start + TYPES_PER_CALL]
            try:
                looked_up = self._describe_types(client, batch)
            except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
                self._warn(
                    f"{self.NAME}: ec2:DescribeInstanceTypes failed in region {region} ({error_code(e) or to_native(e)}); "
                    f"dt_gpu_count is 0 for {', '.join(batch)}."
                )
                result.update({t: 0 for t in batch})
                continue
            with self._gpu_memo_lock:
                for t, count in looked_up.items():
                    self._gpu_memo[(endpoint, region, t)] = count
            result.update(looked_up)
        return result

    def _describe_types(self, client, batch):
        """{type: gpu count or None}; InvalidInstanceType for some types does not lose the others."""
        counts = {}
        pending = list(batch)
        while pending:
            try:
                answer = client.describe_instance_types(InstanceTypes=pending)
            except botocore.exceptions.ClientError as e:
                if error_code(e) != "InvalidInstanceType":
                    raise
                bad = invalid_types_in(e.response.get("Error", {}).get("Message", ""), pending)
                if not bad:
                    if len(pending) == 1:
                        bad = pending
                    else:  # message not understood: ask one by one
                        for t in pending:
                            counts.update(self._describe_types(client, [t]))
                        return counts
                for t in bad:
                    counts[t] = None
                pending = [t for t in pending if t not in bad]
                continue
            for info in answer.get("InstanceTypes") or ():
                counts[info["InstanceType"]] = gpu_count_of(info)
            for t in pending:
                counts.setdefault(t, None)
            pending = []
        return counts

    def _plan(self):
        clusters = list(self.get_option("clusters") or [])
        includes, excludes = query_plan(
            clusters,
            self.get_option("filters"),
            self.get_option("include_filters"),
            self.get_option("exclude_filters"),
        )
        gpu_overrides = self.get_option("gpu_counts") or {}
        return _Plan(includes, excludes, clusters, gpu_overrides, bool(self.get_option("strict_permissions")))

    def _query(self):
        """{'format': ..., 'regions': {region: raw results}}: the regions concurrently."""
        regions = self._regions()
        plan = self._plan()
        super()._set_frozen_credentials()  # assume_role_arn, if set
        # amazon.aws makes a boto3 session per client: make them here, use them in the threads.
        config = client_config()
        clients = {region: self.client("ec2", region=region, config=config) for region in regions}
        results = {}
        errors = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(regions))) as pool:
            futures = {pool.submit(self._query_region, clients[r], r, plan): r for r in regions}
            for future in concurrent.futures.as_completed(futures):
                region = futures[future]
                try:
                    results[region] = future.result()
                except _RegionSkipped as e:
                    self._warn(str(e))
                except AnsibleError as e:
                    errors.append((regions.index(region), e))
        if errors:
            raise min(errors, key=lambda x: x[0])[1]
        return {"format": CACHE_FORMAT, "regions": {r: results[r] for r in regions if r in results}}

    # -- cache -------------------------------------------------------------------

    def _signature(self):
        """What the cached result depends on besides the file path."""
        return repr(tuple(self.get_option(name) for name in SIGNATURE_OPTIONS))

    def _cached_results(self, path, cache, signature):
        """The cached raw results of this very query, or None."""
        hit, cached = self.get_cached_result(path, cache)
        if hit and isinstance(cached, dict) and cached.get("format") == CACHE_FORMAT:
            if cached.get("signature") == signature:
                return cached
        return None

    # -- inventory -------------------------------------------------------------

    def _populate(self, results):
        preferences = self.get_option("hostnames")
        gpu_overrides = self.get_option("gpu_counts") or {}
        constructed = tuple(self.get_option(name) for name in ("compose", "groups", "keyed_groups", "strict"))
        for group in FIXED_GROUPS:
            self.inventory.add_group(group)
        used = {}
        for region, data in results["regions"].items():
            gpus = data.get("gpus") or {}
            for instance in data.get("instances") or ():
                gpu = self._gpu_count(instance.get("InstanceType"), region, gpus, gpu_overrides)
                hostvars = host_vars(instance, region, gpu)
                name = self._hostname(instance, hostvars, preferences, used)
                self._add_host(name, hostvars, constructed)

    def _gpu_count(self, itype, region, gpus, overrides):
        if itype in overrides:
            return overrides[itype]
        gpu = gpus.get(itype)
        if gpu is None:
            self._warn(
                f"{self.NAME}: instance type {itype} is unknown to ec2:DescribeInstanceTypes in "
                f"region {region}; dt_gpu_count is 0 (set gpu_counts: {{{itype}: N}} to override)."
            )
        return gpu

    def _hostname(self, instance, hostvars, preferences, used):
        name, skipped = choose_hostname(instance, preferences, used)
        if skipped:
            self._warn(
                f"{self.NAME}: {hostvars['dt_instance_id']} ({hostvars['dt_region']}) cannot be named "
                f"{', '.join(skipped)}: already used by {used[skipped[0]]}; using '{name}'."
            )
        used[name] = hostvars["dt_instance_id"]
        return name

    def _add_host(self, name, hostvars, constructed):
        inventory = self.inventory
        inventory.add_host(name)
        for group in host_groups(hostvars):
            inventory.add_child(inventory.add_group(group), name)
        for key, value in hostvars.items():
            inventory.set_variable(name, key, value)
        compose, groups, keyed_groups, strict = constructed
        if compose:
            self._set_composite_vars(compose, hostvars, name, strict=strict)
        if groups:
            self._add_host_to_composed_groups(groups, hostvars, name, strict=strict)
        if keyed_groups:
            self._add_host_to_keyed_groups(keyed_groups, hostvars, name, strict=strict)

    def parse(self, inventory, loader, path, cache=True):
        """Options -> (cache or query) -> populate -> cache."""
        if not HAS_BOTO3:
            raise AnsibleParserError(f"{self.NAME} requires boto3 and botocore on the controller: pip install boto3")
        super().parse(inventory, loader, path, cache=cache)
        try:
            check_hostnames(self.get_option("hostnames"))
        except ValueError as e:
            raise AnsibleParserError(f"{path}: {e}")
        signature = self._signature()
        results = self._cached_results(path, cache, signature)
        fetched = results is None
        if fetched:
            results = dict(self._query(), signature=signature)
        try:
            self._populate(results)
        finally:
            self._flush_warnings()
        if fetched and self.get_option("cache"):
            # (not update_cached_result(): it keeps an existing entry, even one of another query)
            self._cache[self.get_cache_key(path)] = results
