# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""EC2 instances as this collection's AWS modules read them: one DescribeInstances (all pages), and an instance in
the form amazon.aws's ec2_instance_info returns (what the roles' templates read), so a module's instances can stand
in for that module's."""
from __future__ import annotations

from ansible.module_utils.common.dict_transformations import camel_dict_to_snake_dict

from ansible_collections.amazon.aws.plugins.module_utils.tagging import boto3_tag_list_to_ansible_dict


def describe(client, **kwargs):
    """The instances of a DescribeInstances call (all pages)."""
    pages = client.get_paginator("describe_instances").paginate(**kwargs).build_full_result()
    return [i for r in pages.get("Reservations", []) for i in r.get("Instances", [])]


def as_info(instance):
    """An instance as ec2_instance_info returns it (snake_case keys, tags as a dict)."""
    snaked = camel_dict_to_snake_dict(instance)
    snaked["tags"] = boto3_tag_list_to_ansible_dict(snaked.get("tags", []), "key", "value")
    return snaked
