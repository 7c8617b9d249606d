# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""The EC2 tag names of a cluster and of its node images: their one home (DESIGN "EC2 tags").

The inventory plugin (``ec2_elastic``) and the modules import these names; the roles and the playbooks
read them through the ``dynatrain.elastic.cluster_tags`` lookup (``roles/cluster/vars/main.yml``'s
``_cluster_tag``, ``roles/node_image/vars/main.yml``'s ``_node_image_tag``). DT's names (``NodeType``,
``elastic_worker_status``, the ``<cluster>-aws-dl-cfn-elastic-worker`` marker) are kept as DT spells them,
so that DT's console workflow reads our instances; ours carry the ``dynatrain:`` prefix. Standard library
only.
"""

from __future__ import annotations

PREFIX = "dynatrain:"

# The instances of a cluster (roles/cluster: the launch templates, launch, tag; the inventory plugin).
CLUSTER = PREFIX + "cluster"            # the cluster's name, on every resource of it
ROLE = PREFIX + "role"                  # master | worker (| image-builder: the node_image role's builder)
GROUP = PREFIX + "group"                # base | elastic | pool
NODE_TYPE = "NodeType"                  # DT's Master | Worker
STATUS = "elastic_worker_status"        # DT's ADD_QUEUED -> ADDED -> REMOVAL_QUEUED -> REMOVED, ADD_FAILED, FAILED
# When elastic_worker_status was last set (epoch seconds): reconcile finishes or rolls back an
# ADD_QUEUED/REMOVAL_QUEUED that outlived its operation (dt_queued_timeout).
STATUS_TIME = PREFIX + "status-time"
LAUNCH_TOKEN = PREFIX + "launch-token"  # a warm-pool take's claim (ec2_pool_take)
# The node runtime a pool worker was configured with (the runtime wheel's file name), set when it is
# parked: a take refuses one whose runtime is not the launcher's (warm_pool_runtime).
RUNTIME = PREFIX + "runtime"
MARKET = PREFIX + "market"              # spot | on-demand
# The cluster's shared file system (its id), on every instance the launch templates start: configure_nodes
# mounts it without an AWS call to find it.
EFS = PREFIX + "efs"
# DT's console workflow: the tag <cluster>-aws-dl-cfn-elastic-worker marks an elastic worker; deleting it
# asks for its removal.
ELASTIC_SUFFIX = "-aws-dl-cfn-elastic-worker"

# A baked node image (roles/node_image, bake_image.yml): its name, its recipe's digest, its engine.
IMAGE = PREFIX + "image"
RECIPE = PREFIX + "recipe"
ENGINE = PREFIX + "engine"
# The checkpoint bucket's role and instance profile (roles/checkpoint_bucket).
PURPOSE = PREFIX + "purpose"

# The names by key, as the roles read them (lookup('dynatrain.elastic.cluster_tags')).
TAGS = {
    "cluster": CLUSTER,
    "role": ROLE,
    "group": GROUP,
    "node_type": NODE_TYPE,
    "status": STATUS,
    "status_time": STATUS_TIME,
    "launch_token": LAUNCH_TOKEN,
    "runtime": RUNTIME,
    "market": MARKET,
    "efs": EFS,
    "image": IMAGE,
    "recipe": RECIPE,
    "engine": ENGINE,
    "purpose": PURPOSE,
}


def elastic_tag(cluster):
    """DT's elastic-worker tag of cluster ``cluster``: ``<cluster>-aws-dl-cfn-elastic-worker``."""
    return f"{cluster}{ELASTIC_SUFFIX}"


def tag_names(keys=(), cluster=None):
    """{key: tag name} of ``keys`` (all of TAGS when empty); with ``cluster``, also ``elastic``: its
    elastic-worker tag. An unknown key raises KeyError naming the known ones."""
    unknown = [k for k in keys if k not in TAGS]
    if unknown:
        raise KeyError(f"no tag named {', '.join(unknown)}: the tags are {', '.join(sorted(TAGS))}")
    names = {k: TAGS[k] for k in (keys or TAGS)}
    if cluster is not None:
        names["elastic"] = elastic_tag(cluster)
    return names
