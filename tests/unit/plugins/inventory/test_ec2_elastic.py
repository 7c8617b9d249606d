"""Unit tests for dynatrain.elastic.ec2_elastic against moto's in-process mock_aws."""
from __future__ import annotations

import datetime
import json

import botocore.exceptions
import pytest
import yaml
from ansible.errors import AnsibleError, AnsibleParserError
from ansible.inventory.data import InventoryData
from ansible.parsing.dataloader import DataLoader
from moto import mock_aws
from moto.core import set_initial_no_auth_action_count

from ansible_collections.dynatrain.elastic.plugins.inventory import ec2_elastic as ee

from ec2_elastic_testlib import NAME, ec2_client, free_port, launch, new_plugin

FIXED = set(ee.FIXED_GROUPS)


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


@pytest.fixture
def warnings(monkeypatch):
    seen = []
    monkeypatch.setattr(ee.display, "warning", lambda msg, *a, **k: seen.append(str(msg)))
    return seen


def write_config(tmp_path, config, name="test.ec2_elastic.yml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(dict({"plugin": NAME}, **config)))
    return str(path)


def parse(path, cache=True):
    plugin = new_plugin()
    inventory = InventoryData()
    plugin.parse(inventory, DataLoader(), path, cache=cache)
    try:
        plugin.update_cache_if_changed()
    except AttributeError:
        pass
    return inventory


def run(tmp_path, cache=True, name="test.ec2_elastic.yml", **config):
    return parse(write_config(tmp_path, config, name), cache=cache)


def members(inventory, group):
    return sorted(h.name for h in inventory.groups[group].get_hosts()) if group in inventory.groups else []


def hv(inventory, host):
    return inventory.get_host(host).get_vars()


def by_id(inventory):
    return {v["dt_instance_id"]: h for h, v in ((h, hv(inventory, h)) for h in inventory.hosts)}


def reads(calls):
    """The API calls the plugin makes (the tests themselves call RunInstances etc.)."""
    return [c for c in calls if c[1] in ("DescribeInstances", "DescribeInstanceTypes", "AssumeRole")]


def ops(calls, name):
    return [c for c in calls if c[1] == name]


@pytest.fixture
def two_clusters():
    """Cluster 'alpha' in us-east-1 (dynatrain:role tags, every elastic status, spot, on-demand);
    cluster 'beta-2' in eu-west-1 (DT NodeType tags). Plus noise that must be left out."""
    with mock_aws():
        east = ec2_client("us-east-1")
        west = ec2_client("eu-west-1")
        ids = {}
        ids["a_master"] = launch(east, cluster="alpha", role="master", name="alpha-master", instance_type="c5.xlarge")[0]
        ids["a_base"] = launch(east, 2, cluster="alpha", role="worker", instance_type="g4dn.xlarge")
        ids["a_base_spot"] = launch(east, cluster="alpha", role="worker", instance_type="g4dn.12xlarge", spot=True)[0]
        for status in ee.STATUSES:
            ids["a_" + status] = launch(
                east, cluster="alpha", role="worker", elastic=True, status=status, instance_type="g4dn.xlarge",
                spot=(status == "ADDED"),
            )[0]
        # elastic tag only (no role tag) -> worker
        ids["a_elastic_norole"] = launch(east, cluster="alpha", elastic=True, status="ADD_QUEUED")[0]
        # cluster tag, no role at all
        ids["a_norole"] = launch(east, cluster="alpha")[0]
        # stopped: kept; terminated: left out
        ids["a_stopped"] = launch(east, cluster="alpha", role="worker")[0]
        east.stop_instances(InstanceIds=[ids["a_stopped"]])
        ids["a_terminated"] = launch(east, cluster="alpha", role="worker")[0]
        east.terminate_instances(InstanceIds=[ids["a_terminated"]])
        # no cluster tag: left out
        ids["stranger"] = launch(east, name="web")[0]

        ids["b_master"] = launch(west, cluster="beta-2", node_type="Master", instance_type="c5.large")[0]
        ids["b_worker"] = launch(west, cluster="beta-2", node_type="Worker", instance_type="p3.8xlarge")[0]
        ids["b_spot"] = launch(
            west, cluster="beta-2", node_type="Worker", elastic=True, status="ADDED", spot=True,
            instance_type="g4dn.xlarge",
        )[0]
        yield ids


BOTH = {"regions": ["us-east-1", "eu-west-1"]}


# ---------------------------------------------------------------------------
# pure functions
# ---------------------------------------------------------------------------


def test_tags_to_dict():
    assert ee.tags_to_dict([{"Key": "a", "Value": "1"}, {"Key": "b"}]) == {"a": "1", "b": ""}
    assert ee.tags_to_dict(None) == {}


@pytest.mark.parametrize(
    "name,group",
    [("alpha", "dt_cluster_alpha"), ("beta-2", "dt_cluster_beta_2"), ("a.b c/d", "dt_cluster_a_b_c_d")],
)
def test_cluster_group_is_sanitised(name, group):
    assert ee.cluster_group(name) == group


@pytest.mark.parametrize(
    "tags,elastic,role",
    [
        ({"dynatrain:role": "master"}, False, "master"),
        ({"dynatrain:role": "Worker"}, False, "worker"),
        ({"NodeType": "Master"}, False, "master"),
        ({"NodeType": "Worker"}, True, "worker"),
        ({"dynatrain:role": "worker", "NodeType": "Master"}, False, "worker"),  # ours wins
        ({}, True, "worker"),
        ({}, False, None),
        ({"dynatrain:role": "bogus"}, False, None),
    ],
)
def test_node_role(tags, elastic, role):
    assert ee.node_role(tags, elastic) == role


def test_host_vars_complete():
    launch_time = datetime.datetime(2024, 5, 1, 12, 30, tzinfo=datetime.timezone.utc)
    instance = {
        "InstanceId": "i-1",
        "InstanceType": "g4dn.xlarge",
        "State": {"Name": "running"},
        "PrivateIpAddress": "10.0.0.5",
        "PublicIpAddress": "54.1.2.3",
        "PrivateDnsName": "ip-10-0-0-5.ec2.internal",
        "PublicDnsName": "ec2-54-1-2-3.compute-1.amazonaws.com",
        "LaunchTime": launch_time,
        "InstanceLifecycle": "spot",
        "Placement": {"AvailabilityZone": "us-east-1b"},
        "VpcId": "vpc-1",
        "SubnetId": "subnet-1",
        "ImageId": "ami-1",
        "KeyName": "k",
        "Tags": [
            {"Key": "dynatrain:cluster", "Value": "c1"},
            {"Key": "c1-aws-dl-cfn-elastic-worker", "Value": ""},
            {"Key": "elastic_worker_status", "Value": "removal_queued"},
            {"Key": "dynatrain:efs", "Value": "fs-0123"},
        ],
    }
    assert ee.host_vars(instance, "us-east-1", 1) == {
        "dt_instance_id": "i-1",
        "dt_private_ip": "10.0.0.5",
        "dt_public_ip": "54.1.2.3",
        "dt_cluster": "c1",
        "dt_role": "worker",
        "dt_status": "REMOVAL_QUEUED",
        "dt_lifecycle": "spot",
        "dt_instance_type": "g4dn.xlarge",
        "dt_gpu_count": 1,
        "dt_region": "us-east-1",
        "dt_launch_time": "2024-05-01T12:30:00+00:00",
        "dt_tags": {"dynatrain:cluster": "c1", "c1-aws-dl-cfn-elastic-worker": "", "elastic_worker_status": "removal_queued",
                    "dynatrain:efs": "fs-0123"},
        "dt_elastic": True,
        "dt_pool": False,
        "dt_efs_id": "fs-0123",
        "dt_state": "running",
        "dt_availability_zone": "us-east-1b",
        "dt_private_dns_name": "ip-10-0-0-5.ec2.internal",
        "dt_public_dns_name": "ec2-54-1-2-3.compute-1.amazonaws.com",
        "dt_vpc_id": "vpc-1",
        "dt_subnet_id": "subnet-1",
        "dt_image_id": "ami-1",
        "dt_key_name": "k",
    }
    # the same instance through the cache (JSON) gives the same host vars
    cached = json.loads(json.dumps(ee.trim_instance(instance)))
    assert ee.host_vars(cached, "us-east-1", 1) == ee.host_vars(instance, "us-east-1", 1)
    # minimal instance: missing parts are None, on-demand, region from the zone
    minimal = ee.host_vars({"InstanceId": "i-2", "Placement": {"AvailabilityZone": "eu-west-1a"}}, None, None)
    assert minimal["dt_region"] == "eu-west-1"
    assert minimal["dt_lifecycle"] == "on-demand"
    assert minimal["dt_gpu_count"] == 0
    assert minimal["dt_public_ip"] is None and minimal["dt_cluster"] is None and minimal["dt_role"] is None
    assert minimal["dt_elastic"] is False and minimal["dt_status"] is None and minimal["dt_launch_time"] is None
    assert minimal["dt_efs_id"] is None


@pytest.mark.parametrize(
    "hostvars,groups",
    [
        ({"dt_cluster": "c", "dt_role": "master"}, ["dt_cluster_c", "dt_master", "dt_workers"]),
        ({"dt_cluster": "c", "dt_role": "worker"}, ["dt_cluster_c", "dt_workers", "dt_base"]),
        (
            {"dt_cluster": "c", "dt_role": "worker", "dt_elastic": True, "dt_status": "ADD_QUEUED"},
            ["dt_cluster_c", "dt_workers", "dt_elastic", "dt_status_add_queued"],
        ),
        (
            {"dt_cluster": "c", "dt_role": "worker", "dt_elastic": True, "dt_status": "ADD_FAILED", "dt_lifecycle": "spot"},
            ["dt_cluster_c", "dt_workers", "dt_elastic", "dt_status_add_failed", "dt_spot"],
        ),
        ({"dt_cluster": "c-1", "dt_role": None, "dt_status": "WEIRD"}, ["dt_cluster_c_1"]),
        # a warm-pool worker: in its cluster and dt_pool only (no worker process: not in dt_workers)
        (
            {"dt_cluster": "c", "dt_role": "worker", "dt_elastic": True, "dt_status": "ADD_QUEUED", "dt_pool": True},
            ["dt_cluster_c", "dt_pool"],
        ),
        ({"dt_cluster": "c", "dt_role": "worker", "dt_lifecycle": "on-demand"}, ["dt_cluster_c", "dt_workers", "dt_base"]),
    ],
)
def test_host_groups(hostvars, groups):
    assert ee.host_groups(hostvars) == groups


def test_host_groups_every_status():
    for status in ee.STATUSES:
        assert "dt_status_" + status.lower() in ee.host_groups({"dt_status": status})


def test_hostname_candidates_and_choice():
    instance = {
        "InstanceId": "i-9",
        "PrivateIpAddress": "10.1.1.1",
        "PublicIpAddress": "3.3.3.3",
        "PublicDnsName": "pub.example",
        "PrivateDnsName": "priv.internal",
        "Ipv6Address": "2001:db8::1",
        "Tags": [{"Key": "Name", "Value": "node-9"}],
    }
    prefs = ["tag:Name", "dns-name", "ip-address", "private-dns-name", "ipv6-address", "private-ip-address", "instance-id"]
    assert ee.hostname_candidates(instance, prefs) == [
        "node-9", "pub.example", "3.3.3.3", "priv.internal", "2001:db8::1", "10.1.1.1", "i-9",
    ]
    assert ee.hostname_candidates(instance, ["tag:Missing", "public-ip-address", "public-dns-name"]) == [
        "3.3.3.3", "pub.example",
    ]
    # first free name wins; collisions fall through to the next preference, then the instance id
    assert ee.choose_hostname(instance, ["tag:Name", "instance-id"], {}) == ("node-9", [])
    assert ee.choose_hostname(instance, ["tag:Name", "private-ip-address"], {"node-9": "i-1"}) == ("10.1.1.1", ["node-9"])
    assert ee.choose_hostname(instance, ["tag:Name"], {"node-9": "i-1"}) == ("i-9", ["node-9"])
    assert ee.choose_hostname(instance, ["tag:Name"], {"node-9": "i-9"}) == ("node-9", [])
    assert ee.choose_hostname({"InstanceId": "i-8"}, ["tag:Name"], {}) == ("i-8", [])


@pytest.mark.parametrize(
    "prefs,message",
    [
        (["private-ip"], "Did you mean 'private-ip-address'"),
        (["tag:"], "unsupported hostnames entry 'tag:'"),
        ([{"name": "x"}], "must be strings"),
        ([], "non-empty"),
    ],
)
def test_check_hostnames_rejects(prefs, message):
    with pytest.raises(ValueError, match=message):
        ee.check_hostnames(prefs)


def test_filters():
    assert ee.base_filters([], {}) == [
        {"Name": "tag-key", "Values": ["dynatrain:cluster"]},
        {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]},
    ]
    assert ee.base_filters(["a", "b"], {"instance-state-name": "running", "instance-type": ["t3.micro"]}) == [
        {"Name": "tag:dynatrain:cluster", "Values": ["a", "b"]},
        {"Name": "instance-state-name", "Values": ["running"]},
        {"Name": "instance-type", "Values": ["t3.micro"]},
    ]
    includes, excludes = ee.query_plan(["a"], {"instance-type": "x"}, [{"tag:Name": "n"}, {"vpc-id": "v"}], [{"tag:k": "v"}])
    assert len(includes) == 2 and len(excludes) == 1
    assert {"Name": "instance-type", "Values": ["x"]} in includes[0] and {"Name": "tag:Name", "Values": ["n"]} in includes[0]
    assert {"Name": "tag:dynatrain:cluster", "Values": ["a"]} in excludes[0]
    assert ee.query_plan([], {}, [], []) == ([ee.base_filters([], {})], [])


def test_gpu_helpers():
    assert ee.gpu_count_of({"GpuInfo": {"Gpus": [{"Count": 4}, {"Count": 4}]}}) == 8
    assert ee.gpu_count_of({"InstanceType": "t3.micro"}) == 0
    msg = "The following supplied instance types do not exist: [p3.2xlarge, p3.8xlarge]"
    assert ee.invalid_types_in(msg, ["t3.micro", "p3.2xlarge", "p3.8xlarge"]) == ["p3.2xlarge", "p3.8xlarge"]
    assert ee.invalid_types_in("nonsense", ["t3.micro"]) == []


def test_iso_time_and_keep_instance():
    assert ee.iso_time(datetime.datetime(2024, 1, 2, 3, 4, 5)) == "2024-01-02T03:04:05+00:00"
    assert ee.iso_time("2024-01-02T03:04:05+00:00") == "2024-01-02T03:04:05+00:00"
    live = {"State": {"Name": "running"}, "Tags": [{"Key": "dynatrain:cluster", "Value": "a"}]}
    assert ee.keep_instance(live, [])
    assert ee.keep_instance(live, ["a"]) and not ee.keep_instance(live, ["b"])
    for state in ("terminated", "shutting-down"):
        assert not ee.keep_instance(dict(live, State={"Name": state}), [])
    assert not ee.keep_instance({"State": {"Name": "running"}, "Tags": []}, [])


# ---------------------------------------------------------------------------
# the plugin against moto
# ---------------------------------------------------------------------------


def test_two_clusters_two_regions_every_group_and_var(tmp_path, two_clusters, api_calls, warnings):
    ids = two_clusters
    inv = run(tmp_path, hostnames=["instance-id"], **BOTH)
    plugin_calls = list(api_calls)
    hosts = set(inv.hosts)
    expected = {v for k, v in ids.items() if k not in ("a_terminated", "stranger", "a_base")} | set(ids["a_base"])
    assert hosts == expected
    assert FIXED <= set(inv.groups)

    a_elastic = [ids["a_" + s] for s in ee.STATUSES] + [ids["a_elastic_norole"]]
    assert members(inv, "dt_master") == sorted([ids["a_master"], ids["b_master"]])
    assert members(inv, "dt_workers") == sorted(
        [ids["a_master"], ids["a_base_spot"], ids["a_stopped"], ids["b_master"], ids["b_worker"], ids["b_spot"]]
        + ids["a_base"] + a_elastic
    )
    assert members(inv, "dt_base") == sorted(ids["a_base"] + [ids["a_base_spot"], ids["a_stopped"], ids["b_worker"]])
    assert members(inv, "dt_elastic") == sorted(a_elastic + [ids["b_spot"]])
    assert members(inv, "dt_status_add_queued") == sorted([ids["a_ADD_QUEUED"], ids["a_elastic_norole"]])
    assert members(inv, "dt_status_added") == sorted([ids["a_ADDED"], ids["b_spot"]])
    assert members(inv, "dt_status_removal_queued") == [ids["a_REMOVAL_QUEUED"]]
    assert members(inv, "dt_status_removed") == [ids["a_REMOVED"]]
    assert members(inv, "dt_status_add_failed") == [ids["a_ADD_FAILED"]]
    assert members(inv, "dt_spot") == sorted([ids["a_base_spot"], ids["a_ADDED"], ids["b_spot"]])
    assert members(inv, "dt_cluster_alpha") == sorted(hosts - {ids["b_master"], ids["b_worker"], ids["b_spot"]})
    assert members(inv, "dt_cluster_beta_2") == sorted([ids["b_master"], ids["b_worker"], ids["b_spot"]])

    master = hv(inv, ids["a_master"])
    east = ec2_client("us-east-1").describe_instances(InstanceIds=[ids["a_master"]])["Reservations"][0]["Instances"][0]
    assert master["dt_instance_id"] == ids["a_master"]
    assert master["dt_private_ip"] == east["PrivateIpAddress"]
    assert master["dt_public_ip"] == east["PublicIpAddress"]
    assert master["dt_cluster"] == "alpha"
    assert master["dt_role"] == "master"
    assert master["dt_status"] is None
    assert master["dt_lifecycle"] == "on-demand"
    assert master["dt_instance_type"] == "c5.xlarge"
    assert master["dt_gpu_count"] == 0
    assert master["dt_region"] == "us-east-1"
    assert master["dt_launch_time"] == east["LaunchTime"].isoformat()
    assert datetime.datetime.fromisoformat(master["dt_launch_time"]).tzinfo is not None
    assert master["dt_tags"] == {"dynatrain:cluster": "alpha", "dynatrain:role": "master", "Name": "alpha-master"}
    assert master["dt_elastic"] is False
    assert master["dt_state"] == "running"
    assert "tags" not in master

    assert hv(inv, ids["a_base"][0])["dt_gpu_count"] == 1  # g4dn.xlarge: 1 T4
    assert hv(inv, ids["a_base_spot"])["dt_gpu_count"] == 4  # g4dn.12xlarge
    assert hv(inv, ids["a_base_spot"])["dt_lifecycle"] == "spot"
    assert hv(inv, ids["a_stopped"])["dt_state"] == "stopped"
    assert hv(inv, ids["a_norole"])["dt_role"] is None
    assert hv(inv, ids["a_elastic_norole"])["dt_role"] == "worker"
    for status in ee.STATUSES:
        vars_ = hv(inv, ids["a_" + status])
        assert vars_["dt_status"] == status and vars_["dt_elastic"] is True and vars_["dt_role"] == "worker"
    beta = hv(inv, ids["b_master"])
    assert (beta["dt_role"], beta["dt_region"], beta["dt_cluster"]) == ("master", "eu-west-1", "beta-2")
    assert hv(inv, ids["b_worker"])["dt_role"] == "worker"
    assert hv(inv, ids["b_spot"])["dt_elastic"] is True
    assert hv(inv, ids["b_spot"])["dt_gpu_count"] == 1

    # one DescribeInstances and one DescribeInstanceTypes per region, nothing per instance
    assert sorted(c[2] for c in ops(plugin_calls, "DescribeInstances")) == ["eu-west-1", "us-east-1"]
    assert len(ops(plugin_calls, "DescribeInstanceTypes")) <= 2 + 1  # + a retry if a type is unknown
    assert {c[1] for c in plugin_calls} == {"DescribeInstances", "DescribeInstanceTypes"}


def test_unknown_instance_type_gives_zero_and_warning(tmp_path, api_calls, warnings):
    with mock_aws():
        east = ec2_client("us-east-1")
        p3 = launch(east, cluster="c", role="worker", instance_type="p3.2xlarge")[0]
        g4 = launch(east, cluster="c", role="worker", instance_type="g4dn.xlarge")[0]
        p4 = launch(east, cluster="c", role="master", instance_type="p4d.24xlarge")[0]
        inv = run(tmp_path, regions=["us-east-1"], hostnames=["instance-id"])
    assert hv(inv, p3)["dt_gpu_count"] == 0
    assert hv(inv, g4)["dt_gpu_count"] == 1
    assert hv(inv, p4)["dt_gpu_count"] == 8
    assert any("p3.2xlarge is unknown" in w and "gpu_counts" in w for w in warnings)
    # the batch with the bad type is retried without it: 2 calls, not one per type
    assert len(ops(api_calls, "DescribeInstanceTypes")) == 2


def test_gpu_counts_override_skips_lookup(tmp_path, api_calls, warnings):
    with mock_aws():
        p3 = launch(ec2_client("us-east-1"), cluster="c", role="worker", instance_type="p3.2xlarge")[0]
        inv = run(tmp_path, regions=["us-east-1"], hostnames=["instance-id"], gpu_counts={"p3.2xlarge": 1})
    assert hv(inv, p3)["dt_gpu_count"] == 1
    assert not ops(api_calls, "DescribeInstanceTypes")
    assert not warnings


def test_many_instance_types_are_batched(tmp_path, api_calls):
    types = ["t3.micro", "t3.small", "t3.medium", "m5.large", "c5.large", "g4dn.xlarge", "g5.xlarge", "p4d.24xlarge"]
    with mock_aws():
        east = ec2_client("us-east-1")
        for t in types:
            launch(east, cluster="c", role="worker", instance_type=t)
        inv = run(tmp_path, regions=["us-east-1"])
    assert len(inv.hosts) == len(types)
    assert len(ops(api_calls, "DescribeInstanceTypes")) == 1


def test_clusters_option(tmp_path, two_clusters, api_calls):
    ids = two_clusters
    inv = run(tmp_path, hostnames=["instance-id"], clusters=["beta-2"], **BOTH)
    assert set(inv.hosts) == {ids["b_master"], ids["b_worker"], ids["b_spot"]}
    assert "dt_cluster_alpha" not in inv.groups
    first = ops(api_calls, "DescribeInstances")[0]
    assert first  # server-side: the cluster filter is in the request (checked via plan)
    assert {"Name": "tag:dynatrain:cluster", "Values": ["beta-2"]} in ee.query_plan(["beta-2"], {}, [], [])[0][0]


def test_filters_include_exclude(tmp_path, two_clusters, api_calls):
    ids = two_clusters
    inv = run(tmp_path, hostnames=["instance-id"], regions=["us-east-1"], filters={"instance-type": "g4dn.xlarge"})
    assert set(inv.hosts) == set(ids["a_base"]) | {ids["a_" + s] for s in ee.STATUSES}

    inv = run(
        tmp_path,
        hostnames=["instance-id"],
        regions=["us-east-1"],
        include_filters=[{"tag:dynatrain:role": "master"}, {"tag:elastic_worker_status": ["ADDED", "REMOVED"]}],
        exclude_filters=[{"tag:elastic_worker_status": "ADDED"}],
    )
    assert set(inv.hosts) == {ids["a_master"], ids["a_REMOVED"]}

    inv = run(tmp_path, hostnames=["instance-id"], regions=["us-east-1"], filters={"instance-state-name": "stopped"})
    assert set(inv.hosts) == {ids["a_stopped"]}


@pytest.mark.parametrize(
    "prefs,key",
    [
        (["private-ip-address"], "PrivateIpAddress"),
        (["instance-id"], "InstanceId"),
        (["ip-address"], "PublicIpAddress"),
        (["dns-name"], "PublicDnsName"),
        (["private-dns-name"], "PrivateDnsName"),
        (["tag:Name", "instance-id"], None),
    ],
)
def test_hostnames_option(tmp_path, prefs, key):
    with mock_aws():
        east = ec2_client("us-east-1")
        named = launch(east, cluster="c", role="master", name="the-master")[0]
        plain = launch(east, cluster="c", role="worker")[0]
        inv = run(tmp_path, regions=["us-east-1"], hostnames=prefs)
        described = {
            i["InstanceId"]: i for r in east.describe_instances()["Reservations"] for i in r["Instances"]
        }
    if key is None:
        assert set(inv.hosts) == {"the-master", plain}
    else:
        assert set(inv.hosts) == {described[named][key], described[plain][key]}
    assert hv(inv, by_id(inv)[named])["dt_instance_id"] == named


def test_hostname_collision_falls_back(tmp_path, warnings):
    with mock_aws():
        east = ec2_client("us-east-1")
        a = launch(east, cluster="c", role="master", name="same")[0]
        b = launch(east, cluster="c", role="worker", name="same")[0]
        inv = run(tmp_path, regions=["us-east-1"], hostnames=["tag:Name", "instance-id"])
    assert set(inv.hosts) == {"same", b} or set(inv.hosts) == {"same", a}
    assert any("already used by" in w for w in warnings)


def test_bad_hostnames_option(tmp_path):
    with mock_aws(), pytest.raises(AnsibleParserError, match="Did you mean 'private-ip-address'"):
        run(tmp_path, regions=["us-east-1"], hostnames=["private_ip_address"])


def test_constructed_compose_groups_keyed_groups(tmp_path, two_clusters):
    ids = two_clusters
    inv = run(
        tmp_path,
        hostnames=["instance-id"],
        compose={"ansible_host": "dt_private_ip", "gpus_x2": "dt_gpu_count * 2"},
        groups={"gpu_nodes": "dt_gpu_count > 0", "named": "'Name' in dt_tags"},
        keyed_groups=[{"key": "dt_region", "prefix": "region"}, {"key": "dt_instance_type", "prefix": "type"}],
        **BOTH,
    )
    master = hv(inv, ids["a_master"])
    assert master["ansible_host"] == master["dt_private_ip"]
    assert hv(inv, ids["a_base_spot"])["gpus_x2"] == 8
    assert ids["a_base_spot"] in members(inv, "gpu_nodes") and ids["a_master"] not in members(inv, "gpu_nodes")
    assert members(inv, "named") == [ids["a_master"]]
    assert members(inv, "region_eu_west_1") == sorted([ids["b_master"], ids["b_worker"], ids["b_spot"]])
    assert ids["a_master"] in members(inv, "type_c5_xlarge")


def test_strict(tmp_path, two_clusters):
    config = dict(BOTH, hostnames=["instance-id"], compose={"x": "dt_no_such_var + 1"})
    inv = run(tmp_path, **config)  # strict: false ignores the error
    assert "x" not in hv(inv, two_clusters["a_master"])
    with pytest.raises(AnsibleError, match="Could not set x"):
        run(tmp_path, strict=True, **config)


def test_cache_second_run_makes_no_api_call(tmp_path, api_calls):
    cache_dir = tmp_path / "cache"
    config = dict(
        regions=["us-east-1"], hostnames=["instance-id"], cache=True,
        cache_plugin="jsonfile", cache_connection=str(cache_dir), cache_timeout=3600,
    )
    with mock_aws():
        east = ec2_client("us-east-1")
        first_ids = launch(east, 3, cluster="c", role="worker", instance_type="g4dn.xlarge")
        path = write_config(tmp_path, config)
        inv1 = parse(path)
        assert reads(api_calls) and list(cache_dir.iterdir())
        calls_after_first = len(reads(api_calls))
        launch(east, cluster="c", role="worker", instance_type="g4dn.xlarge")  # not seen through the cache
        inv2 = parse(path)
        assert len(reads(api_calls)) == calls_after_first  # no API call at all
        assert set(inv2.hosts) == set(inv1.hosts) == set(first_ids)
        for h in inv1.hosts:
            assert hv(inv1, h) == hv(inv2, h)
        # refresh_inventory / --flush-cache: cache=False queries again and updates the cache
        inv3 = parse(path, cache=False)
        assert len(inv3.hosts) == 4 and len(reads(api_calls)) > calls_after_first
        calls = len(reads(api_calls))
        inv4 = parse(path)
        assert len(inv4.hosts) == 4 and len(reads(api_calls)) == calls
        # a changed query (another cluster list) does not reuse the old answer
        config["clusters"] = ["other"]
        inv5 = parse(write_config(tmp_path, config))
        assert not inv5.hosts and len(reads(api_calls)) > calls


def test_no_cache_by_default_sees_new_instances(tmp_path, api_calls):
    with mock_aws():
        east = ec2_client("us-east-1")
        launch(east, cluster="c", role="master", instance_type="g4dn.xlarge")
        path = write_config(tmp_path, {"regions": ["us-east-1"]})
        assert len(parse(path).hosts) == 1
        launch(east, 2, cluster="c", role="worker", elastic=True, status="ADD_QUEUED", instance_type="g4dn.xlarge")
        inv = parse(path)
        assert len(inv.hosts) == 3 and len(members(inv, "dt_status_add_queued")) == 2
    assert len(ops(api_calls, "DescribeInstances")) == 2
    assert len(ops(api_calls, "DescribeInstanceTypes")) == 1  # instance types are remembered


def test_credentials_options(tmp_path, monkeypatch, api_calls):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with mock_aws():
        launch(ec2_client("us-east-1", aws_access_key_id="a", aws_secret_access_key="b"), cluster="c", role="master")
        inv = run(tmp_path, regions=["us-east-1"], aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret")
        assert len(inv.hosts) == 1
        # aws_ec2-compatible aliases
        inv = run(tmp_path, regions=["us-east-1"], access_key="AKIDEXAMPLE", secret_key="secret", session_token="t")
        assert len(inv.hosts) == 1
    # (outside mock_aws, which puts fake keys in the environment)
    with pytest.raises(AnsibleParserError, match="must be set together"):
        run(tmp_path, regions=["us-east-1"], aws_access_key_id="AKIDEXAMPLE")
    with pytest.raises(AnsibleParserError, match="mutually exclusive"):
        run(tmp_path, regions=["us-east-1"], aws_access_key_id="A", aws_secret_access_key="B", profile="p")


def test_no_credentials(tmp_path, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(AnsibleParserError, match="no AWS credentials found; set access_key and secret_key"):
        run(tmp_path, regions=["us-east-1"])


def test_profile(tmp_path, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    conf = tmp_path / "aws-config"
    conf.write_text("[profile training]\naws_access_key_id = AKIDPROFILE\naws_secret_access_key = s\nregion = eu-west-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(conf))
    with mock_aws():
        launch(ec2_client("eu-west-1"), cluster="c", role="master")
        inv = run(tmp_path, profile="training")  # region from the profile
        assert [hv(inv, h)["dt_region"] for h in inv.hosts] == ["eu-west-1"]
        monkeypatch.setenv("AWS_PROFILE", "training")  # env works too
        assert len(run(tmp_path, regions=["eu-west-1"]).hosts) == 1
        with pytest.raises(AnsibleParserError, match="profile 'nope' not found"):
            run(tmp_path, regions=["eu-west-1"], profile="nope")


def test_assume_role(tmp_path, api_calls):
    with mock_aws():
        launch(ec2_client("us-east-1"), cluster="c", role="master")
        inv = run(tmp_path, regions=["us-east-1"], assume_role_arn="arn:aws:iam::123456789012:role/dt-inventory")
        assert len(inv.hosts) == 1
    assert ("sts", "AssumeRole", "us-east-1") in api_calls


def test_assume_role_failure_is_clear(tmp_path, monkeypatch):
    with mock_aws():
        with pytest.raises(AnsibleParserError, match="could not assume role not-an-arn"):
            run(tmp_path, regions=["us-east-1"], assume_role_arn="not-an-arn")


def test_no_region(tmp_path):
    with mock_aws(), pytest.raises(AnsibleParserError, match="no region to query; set 'regions'"):
        run(tmp_path)


def test_default_region_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    with mock_aws():
        launch(ec2_client("eu-west-1"), cluster="c", role="master")
        assert len(run(tmp_path).hosts) == 1


def test_unknown_region(tmp_path):
    with mock_aws(), pytest.raises(AnsibleParserError, match="unknown region 'us-east1' in 'regions'. Did you mean 'us-east-1'"):
        run(tmp_path, regions=["eu-west-1", "us-east1"])


def test_endpoint_that_refuses(tmp_path):
    port = free_port()
    with pytest.raises(AnsibleParserError, match=r"could not connect to the EC2 API at http://127.0.0.1:%d .*Check endpoint_url" % port):
        run(tmp_path, regions=["us-east-1"], endpoint_url=f"http://127.0.0.1:{port}")


def test_wrong_suffix(tmp_path, warnings):
    plugin = new_plugin()
    good = write_config(tmp_path, {"regions": ["us-east-1"]})
    assert plugin.verify_file(good)
    assert plugin.verify_file(write_config(tmp_path, {}, "x.ec2_elastic.yaml"))
    bad = write_config(tmp_path, {"regions": ["us-east-1"]}, "inventory.aws_ec2.yml")
    assert not plugin.verify_file(bad)
    assert any("must end in 'ec2_elastic.yml' or 'ec2_elastic.yaml'" in w for w in warnings)
    other = tmp_path / "hosts.yml"
    other.write_text("all:\n  hosts:\n    a:\n")
    warnings.clear()
    assert not plugin.verify_file(str(other)) and not warnings  # not ours: silent


def test_unknown_option(tmp_path):
    # ('region' is an option now, from amazon.aws's region fragment: see test_region_option)
    with mock_aws(), pytest.raises(AnsibleParserError, match=r"unknown option\(s\).*'cluster' \(did you mean 'clusters'\?\)"):
        run(tmp_path, regions=["us-east-1"], cluster="alpha")


def test_strict_permissions_with_iam(tmp_path, warnings):
    """A user without permissions: AccessDenied is an error, or (strict_permissions: false) a skip."""
    with mock_aws():
        launch(ec2_client("us-east-1"), cluster="c", role="master")

        @set_initial_no_auth_action_count(2)
        def denied():
            iam = __import__("boto3").client("iam", region_name="us-east-1")
            iam.create_user(UserName="nobody")
            key = iam.create_access_key(UserName="nobody")["AccessKey"]
            creds = {"aws_access_key_id": key["AccessKeyId"], "aws_secret_access_key": key["SecretAccessKey"]}
            with pytest.raises(AnsibleParserError, match="not allowed to call ec2:DescribeInstances in region us-east-1.*strict_permissions: false"):
                run(tmp_path, regions=["us-east-1"], **creds)
            inv = run(tmp_path, regions=["us-east-1"], strict_permissions=False, **creds)
            assert not inv.hosts and FIXED <= set(inv.groups)
            assert any("skipping region us-east-1" in w for w in warnings)

        denied()


def test_describe_instance_types_denied_is_a_warning(tmp_path, warnings):
    with mock_aws():
        launch(ec2_client("us-east-1"), cluster="c", role="master", instance_type="g4dn.xlarge")

        @set_initial_no_auth_action_count(4)
        def partial():
            boto3 = __import__("boto3")
            iam = boto3.client("iam", region_name="us-east-1")
            iam.create_user(UserName="reader")
            policy = {
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": "ec2:DescribeInstances", "Resource": "*"}],
            }
            iam.put_user_policy(UserName="reader", PolicyName="p", PolicyDocument=json.dumps(policy))
            key = iam.create_access_key(UserName="reader")["AccessKey"]
            inv = run(tmp_path, regions=["us-east-1"], aws_access_key_id=key["AccessKeyId"],
                      aws_secret_access_key=key["SecretAccessKey"])
            assert [hv(inv, h)["dt_gpu_count"] for h in inv.hosts] == [0]
            assert any("DescribeInstanceTypes failed" in w for w in warnings)

        partial()


def test_strict_permissions_skips_one_region(tmp_path, two_clusters, monkeypatch, warnings):
    """UnauthorizedOperation in one region: error by default, skipped with strict_permissions: false."""
    real = botocore.client.BaseClient._make_api_call

    def deny_west(self, operation_name, api_params):
        if self.meta.region_name == "eu-west-1" and operation_name == "DescribeInstances":
            raise botocore.exceptions.ClientError(
                {"Error": {"Code": "UnauthorizedOperation", "Message": "You are not authorized"}}, operation_name
            )
        return real(self, operation_name, api_params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", deny_west)
    with pytest.raises(AnsibleParserError, match="not allowed to call ec2:DescribeInstances in region eu-west-1 \\(UnauthorizedOperation\\)"):
        run(tmp_path, **BOTH)
    inv = run(tmp_path, strict_permissions=False, hostnames=["instance-id"], **BOTH)
    assert two_clusters["a_master"] in inv.hosts and two_clusters["b_master"] not in inv.hosts
    assert any("skipping region eu-west-1" in w for w in warnings)


def test_bad_credentials_are_clear(tmp_path, monkeypatch):
    real = botocore.client.BaseClient._make_api_call

    def reject(self, operation_name, api_params):
        raise botocore.exceptions.ClientError({"Error": {"Code": "AuthFailure", "Message": "bad key"}}, operation_name)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", reject)
    with mock_aws(), pytest.raises(AnsibleParserError, match="credentials were rejected in region us-east-1"):
        run(tmp_path, regions=["us-east-1"])
    assert real


def test_templated_credentials(tmp_path, monkeypatch):
    monkeypatch.setenv("DT_TEST_KEY", "AKIDTEMPLATE")
    with mock_aws():
        launch(ec2_client("us-east-1"), cluster="c", role="master")
        inv = run(tmp_path, regions=["us-east-1"], aws_access_key_id="{{ lookup('env', 'DT_TEST_KEY') }}",
                  aws_secret_access_key="x")
        assert len(inv.hosts) == 1


# ---------------------------------------------------------------------------
# what amazon.aws's AWSInventoryBase does for the plugin: options from its doc fragments,
# credentials, clients, default region, endpoint, assume-role
# ---------------------------------------------------------------------------


def parsed_plugin(path, cache=True):
    """The plugin after parse(), to look at the clients it makes."""
    plugin = new_plugin()
    plugin.parse(InventoryData(), DataLoader(), path, cache=cache)
    return plugin


def test_aws_options_come_from_amazon_aws_fragments():
    from ansible import constants as C
    from ansible_collections.amazon.aws.plugins.plugin_utils.inventory import AWSInventoryBase

    assert isinstance(new_plugin(), AWSInventoryBase)
    defs = C.config.get_configuration_definitions("inventory", NAME)
    assert {"aws_access_key_id", "aws_access_key"} <= set(defs["access_key"]["aliases"])
    assert {"aws_secret_access_key", "aws_secret_key"} <= set(defs["secret_key"]["aliases"])
    assert "aws_session_token" in defs["session_token"]["aliases"]
    assert {e["name"] for e in defs["access_key"]["env"]} == {"AWS_ACCESS_KEY_ID", "AWS_ACCESS_KEY"}
    assert {e["name"] for e in defs["profile"]["env"]} >= {"AWS_PROFILE"}
    assert [e["name"] for e in defs["region"]["env"]] == ["AWS_REGION"]
    assert [e["name"] for e in defs["endpoint_url"]["env"]] == ["AWS_URL"]
    assert "iam_role_arn" in defs["assume_role_arn"]["aliases"]
    for ours in ("regions", "clusters", "filters", "hostnames", "gpu_counts", "strict_permissions", "cache", "compose"):
        assert ours in defs


def test_region_option_when_regions_is_empty(tmp_path, monkeypatch, api_calls):
    with mock_aws():
        launch(ec2_client("eu-west-1"), cluster="c", role="master")
        inv = run(tmp_path, region="eu-west-1")
        assert [hv(inv, h)["dt_region"] for h in inv.hosts] == ["eu-west-1"]
        monkeypatch.setenv("AWS_REGION", "eu-west-1")  # the region option's environment variable
        assert len(run(tmp_path).hosts) == 1
        # regions wins over region; an empty list never means 'every region'
        assert not run(tmp_path, regions=["us-east-1"]).hosts
    assert {c[2] for c in ops(api_calls, "DescribeInstances")} == {"eu-west-1", "us-east-1"}


def test_templated_regions_and_clusters_without_deprecation(tmp_path, warnings):
    with mock_aws():
        launch(ec2_client("us-east-1"), cluster="alpha", role="master")
        launch(ec2_client("us-east-1"), cluster="beta", role="master")
        inv = run(tmp_path, regions=["{{ 'us-east-' ~ 1 }}"], clusters=["{{ 'al' ~ 'pha' }}"], hostnames=["instance-id"])
    assert [hv(inv, h)["dt_cluster"] for h in inv.hosts] == ["alpha"]
    assert not warnings  # (amazon.aws's own templating warns 'disable_lookups is deprecated')


@pytest.mark.parametrize("variable", ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_EC2", "AWS_URL"])
def test_endpoint_from_the_environment(tmp_path, monkeypatch, variable):
    port = free_port()
    monkeypatch.setenv(variable, f"http://127.0.0.1:{port}")
    with pytest.raises(AnsibleParserError, match=f"could not connect to the EC2 API at http://127.0.0.1:{port} "):
        run(tmp_path, regions=["us-east-1"])


def test_endpoint_url_option_beats_the_environment(tmp_path, monkeypatch):
    port = free_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    with pytest.raises(AnsibleParserError, match=f"at http://127.0.0.1:{port} "):
        run(tmp_path, regions=["us-east-1"], aws_endpoint_url=f"http://127.0.0.1:{port}")


def test_assume_role_uses_the_endpoint_and_region(tmp_path, api_calls):
    port = free_port()
    with pytest.raises(AnsibleParserError, match=f"could not assume role arn:.*http://127.0.0.1:{port}/"):
        run(tmp_path, regions=["us-east-1"], endpoint_url=f"http://127.0.0.1:{port}",
            iam_role_arn="arn:aws:iam::123456789012:role/dt-inventory")
    with mock_aws():
        launch(ec2_client("eu-west-1"), cluster="c", role="master")
        inv = run(tmp_path, regions=["eu-west-1"], region="eu-west-1", assume_role_arn="arn:aws:iam::123456789012:role/r")
        assert len(inv.hosts) == 1
    assert ("sts", "AssumeRole", "eu-west-1") in api_calls


def test_assumed_role_credentials_are_used(tmp_path):
    with mock_aws():
        path = write_config(tmp_path, {"regions": ["us-east-1"], "assume_role_arn": "arn:aws:iam::123456789012:role/r"})
        plugin = parsed_plugin(path)
        key = plugin.client("ec2", region="us-east-1")._request_signer._credentials.access_key
    assert key != "testing" and key.startswith("ASIA")


def test_cached_run_with_assume_role_makes_no_api_call(tmp_path, api_calls):
    config = dict(regions=["us-east-1"], assume_role_arn="arn:aws:iam::123456789012:role/r", cache=True,
                  cache_plugin="jsonfile", cache_connection=str(tmp_path / "cache"), cache_timeout=3600)
    with mock_aws():
        launch(ec2_client("us-east-1"), cluster="c", role="master")
        path = write_config(tmp_path, config)
        assert len(parse(path).hosts) == 1
        calls = len(reads(api_calls))
        assert len(parse(path).hosts) == 1
    assert len(reads(api_calls)) == calls and ops(api_calls, "AssumeRole")


def test_keys_in_the_file_beat_a_profile_from_the_environment(tmp_path, monkeypatch):
    conf = tmp_path / "aws-config"
    conf.write_text("[profile training]\naws_access_key_id = AKIDPROFILE\naws_secret_access_key = s\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(conf))
    monkeypatch.setenv("AWS_PROFILE", "training")
    with mock_aws():
        plugin = parsed_plugin(write_config(tmp_path, {"regions": ["us-east-1"], "access_key": "AKIDFILE", "secret_key": "s"}))
        assert plugin.client("ec2", region="us-east-1")._request_signer._credentials.access_key == "AKIDFILE"
        plugin = parsed_plugin(write_config(tmp_path, {"regions": ["us-east-1"], "profile": "training"}))
        assert plugin.client("ec2", region="us-east-1")._request_signer._credentials.access_key == "AKIDPROFILE"


def test_validate_certs(tmp_path, monkeypatch):
    bundle = tmp_path / "ca.pem"
    bundle.write_text("")
    monkeypatch.setenv("AWS_CA_BUNDLE", str(bundle))
    with mock_aws():
        plugin = parsed_plugin(write_config(tmp_path, {"regions": ["us-east-1"]}))
        assert plugin.client("ec2", region="us-east-1")._endpoint.http_session._verify == str(bundle)
        plugin = parsed_plugin(write_config(tmp_path, {"regions": ["us-east-1"], "validate_certs": False}))
        assert plugin.client("ec2", region="us-east-1")._endpoint.http_session._verify is False


# ---------------------------------------------------------------------------
# the region of inventories/aws: -e dt_region, else AWS_REGION / AWS_DEFAULT_REGION, else us-east-1
# ---------------------------------------------------------------------------

AWS_INVENTORY = __import__("pathlib").Path(__file__).resolve().parents[4] / "inventories" / "aws" / "aws.ec2_elastic.yml"


@pytest.fixture
def extra_vars(monkeypatch):
    """Set the command line's -e options the way ansible-playbook does (context.CLIARGS)."""
    from ansible import context
    from ansible.module_utils.common.collections import ImmutableDict
    from ansible.utils import vars as ansible_vars

    def set_extra_vars(*options):
        monkeypatch.setattr(context, "CLIARGS", ImmutableDict(extra_vars=tuple(options)))
        monkeypatch.setattr(ansible_vars.load_extra_vars, "extra_vars", None, raising=False)  # its memo

    set_extra_vars()
    return set_extra_vars


@pytest.fixture
def aws_inventory(tmp_path):
    """The shipped inventories/aws config (without its endpoint: moto in-process)."""
    path = tmp_path / "aws.ec2_elastic.yml"
    path.write_text(AWS_INVENTORY.read_text())
    return str(path)


@pytest.fixture
def clusters_in_three_regions():
    with mock_aws():
        for region in ("us-east-1", "us-west-2", "eu-west-1"):
            launch(ec2_client(region), cluster="c-" + region, role="master")
        yield


def regions_seen(inventory):
    return sorted({hv(inventory, h)["dt_region"] for h in inventory.hosts})


@pytest.mark.parametrize(
    "options, env, expected",
    [
        (("dt_region=us-west-2",), {}, "us-west-2"),  # -e dt_region, nothing in the environment
        (("dt_region=us-west-2",), {"AWS_REGION": "eu-west-1"}, "us-west-2"),  # -e beats the environment
        (('{"dt_region": "eu-west-1"}',), {}, "eu-west-1"),  # -e as JSON
        ((), {"AWS_REGION": "eu-west-1"}, "eu-west-1"),
        ((), {"AWS_DEFAULT_REGION": "us-west-2"}, "us-west-2"),
        ((), {"AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "us-west-2"}, "eu-west-1"),
        (("worker_count=2",), {}, "us-east-1"),  # nothing said: us-east-1, as dt_region's default
    ],
)
def test_aws_inventory_follows_dt_region_and_aws_region(
    aws_inventory, clusters_in_three_regions, extra_vars, monkeypatch, api_calls, options, env, expected
):
    extra_vars(*options)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    inv = parse(aws_inventory)
    assert regions_seen(inv) == [expected]
    assert {c[2] for c in ops(api_calls, "DescribeInstances")} == {expected}  # that region only


def test_aws_inventory_group_vars_choose_the_same_region():
    """dt_region's default in group_vars uses the very chain the inventory's regions use."""
    group_vars = yaml.safe_load((AWS_INVENTORY.parent / "group_vars" / "all" / "dynatrain.yml").read_text())
    config = yaml.safe_load(AWS_INVENTORY.read_text())
    assert config["use_extra_vars"] is True
    # (the inventory says lookup('env', ...): its templar has no collection loader for the FQCN in unit tests)
    chain = config["regions"][0].split("|", 1)[1].strip().replace("lookup('env'", "lookup('ansible.builtin.env'")
    assert chain.startswith("default(lookup('ansible.builtin.env', 'AWS_REGION'), true)")
    normalized = " ".join(group_vars["dt_region"].split())
    assert normalized.startswith("{{ lookup('ansible.builtin.env', 'AWS_REGION') | default(lookup('ansible.builtin.env', 'AWS_DEFAULT_REGION'), true)")
    assert normalized.endswith("| default('us-east-1', true) }}")
    assert " ".join(chain.split()).endswith("| default('us-east-1', true) }}")


def test_extra_vars_reach_templated_options_only_with_use_extra_vars(tmp_path, extra_vars):
    extra_vars("dt_region=eu-west-1")
    with mock_aws():
        launch(ec2_client("eu-west-1"), cluster="c", role="master")
        launch(ec2_client("us-east-1"), cluster="c", role="master")
        on = run(tmp_path, use_extra_vars=True, regions=["{{ dt_region | default('us-east-1') }}"])
        off = run(tmp_path, regions=["{{ dt_region | default('us-east-1') }}"])
    assert regions_seen(on) == ["eu-west-1"]
    assert regions_seen(off) == ["us-east-1"]
