# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
name: cluster_tags
author:
  - dynatrain maintainers (@dynatrain)
version_added: "0.1.0"
short_description: The EC2 tag names of a cluster and of its node images
description:
  - The roles' and the playbooks' way to the tag names, whose one home is C(plugins/module_utils/tags.py)
    (the inventory plugin and the modules import it).
  - It returns a mapping of key to tag name, e.g. C(cluster) to C(dynatrain:cluster), C(node_type) to C(NodeType).
options:
  _terms:
    description: The keys to return (C(cluster), C(role), C(group), C(node_type), C(status), C(status_time),
      C(launch_token), C(runtime), C(market), C(efs), C(image), C(recipe), C(engine), C(purpose)); none returns
      them all. An unknown key is an error.
    required: false
    type: list
    elements: str
  cluster:
    description: A cluster's name; the mapping then also holds C(elastic), DT's elastic-worker tag of that
      cluster (C(<cluster>-aws-dl-cfn-elastic-worker)).
    type: str
"""

EXAMPLES = r"""
- name: Find the cluster's subnet
  amazon.aws.ec2_vpc_subnet_info:
    filters: "{{ {'tag:' ~ lookup('dynatrain.elastic.cluster_tags').cluster: cluster_name} }}"

- name: The instance tags of a master
  ansible.builtin.set_fact:
    master_tags: "{{ {_tag.cluster: cluster_name, _tag.role: 'master'} }}"
  vars:
    _tag: "{{ lookup('dynatrain.elastic.cluster_tags', 'cluster', 'role') }}"
"""

RETURN = r"""
_raw:
  description: One mapping of key to tag name.
  type: list
  elements: dict
"""

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.dynatrain.elastic.plugins.module_utils.tags import tag_names


class LookupModule(LookupBase):

    def run(self, terms, variables=None, **kwargs):
        cluster = kwargs.pop("cluster", None)
        if kwargs:
            raise AnsibleLookupError(f"cluster_tags takes only the option cluster, not {', '.join(sorted(kwargs))}")
        try:
            return [tag_names([str(t) for t in terms or ()], cluster=None if cluster is None else str(cluster))]
        except KeyError as exc:
            raise AnsibleLookupError(str(exc.args[0])) from None
