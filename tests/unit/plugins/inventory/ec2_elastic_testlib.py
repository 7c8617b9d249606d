"""Helpers shared by the ec2_elastic inventory tests and the benchmark-style CLI tests."""
from __future__ import annotations

import contextlib
import importlib
import os
import socket

import boto3

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
COLLECTIONS = os.path.join(ROOT, ".collections")
AMI = "ami-12c6146b"  # one of moto's built-in AMIs


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def instance_tags(cluster=None, role=None, node_type=None, elastic=False, status=None, name=None, extra=None):
    tags = {}
    if cluster is not None:
        tags["dynatrain:cluster"] = cluster
    if role:
        tags["dynatrain:role"] = role
    if node_type:
        tags["NodeType"] = node_type
    if elastic:
        tags[f"{cluster}-aws-dl-cfn-elastic-worker"] = "true"
    if status:
        tags["elastic_worker_status"] = status
    if name:
        tags["Name"] = name
    tags.update(extra or {})
    return tags


def launch(ec2, count=1, instance_type="t3.micro", spot=False, **tag_kwargs):
    """run_instances with our tags; returns the instance ids."""
    tags = instance_tags(**tag_kwargs)
    kwargs = {"ImageId": AMI, "MinCount": count, "MaxCount": count, "InstanceType": instance_type}
    if tags:
        kwargs["TagSpecifications"] = [
            {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
        ]
    if spot:
        kwargs["InstanceMarketOptions"] = {"MarketType": "spot"}
    return [i["InstanceId"] for i in ec2.run_instances(**kwargs)["Instances"]]


def ec2_client(region, **kwargs):
    return boto3.client("ec2", region_name=region, **kwargs)


NAME = "dynatrain.elastic.ec2_elastic"
_DEFS_LOADED = []


class _FragmentLoader:
    """ansible's doc fragment loader, plus collections' fragments (amazon.aws.common.plugins...)
    found by a plain import: without ansible's collection finder the real loader cannot."""

    def __init__(self, real):
        self._real = real

    def get(self, name, *args, **kwargs):
        if "." not in name:
            return self._real.get(name, *args, **kwargs)
        parts = name.split(".")
        if len(parts) != 3:
            return None  # add_fragments then retries without the trailing variable name
        try:
            module = importlib.import_module(f"ansible_collections.{parts[0]}.{parts[1]}.plugins.doc_fragments.{parts[2]}")
        except ImportError:
            return None
        fragment = module.ModuleDocFragment()
        fragment.ansible_name = name
        return fragment


@contextlib.contextmanager
def _collection_fragments():
    from ansible.plugins import loader

    real = loader.fragment_loader
    loader.fragment_loader = _FragmentLoader(real)
    try:
        yield
    finally:
        loader.fragment_loader = real


def new_plugin():
    """A plugin instance set up the way ansible's plugin loader does it (option definitions,
    doc fragments included, registered; names set), without installing the collection finder,
    so it works whatever else the test session imported first."""
    from ansible.plugins.loader import inventory_loader

    from ansible_collections.dynatrain.elastic.plugins.inventory import ec2_elastic

    path = os.path.abspath(ec2_elastic.__file__)
    if not _DEFS_LOADED:
        with _collection_fragments():
            inventory_loader._load_config_defs(NAME, ec2_elastic, path)
        _DEFS_LOADED.append(True)
    plugin = ec2_elastic.InventoryModule()
    inventory_loader._update_object(obj=plugin, name=NAME, path=path, redirected_names=[NAME], resolved=NAME)
    return plugin
