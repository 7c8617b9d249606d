#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_image_choose
short_description: Choose the node image the launch templates boot (base AMI, recipe digest, baked image) in one module run
version_added: "0.1.0"
description:
  - "Looks up the base AMI (O(ami_id), else the newest available image named O(ami_name) owned by O(ami_owner)) and
    its root device name; with O(use_baked) and no O(baked_ami_id), computes the recipe digest of a baked node image
    (module_utils node_image_recipe: the files of O(recipe_roles) under O(roles_dir), the wheel names in
    O(wheelhouse_dir), the base AMI, O(instance_type), O(engine)) and finds the newest of this account's available
    images tagged O(image_tag)=O(baked_name) whose O(recipe_tag) is that digest."
  - "RV(image_id) is O(baked_ami_id) when given, else that baked image, else the base AMI. A baked image of another
    recipe is stale (RV(stale)): not used."
  - What the node_image role's main did in five tasks, two of them AWS module runs (each about a second of the
    controller's time); bootstrap, every add and every bake run it (issue 43).
author:
  - dynatrain maintainers (@dynatrain)
options:
  ami_id:
    description: The base AMI to use; empty looks it up by O(ami_name) and O(ami_owner).
    type: str
    default: ""
  ami_name:
    description: The name filter of the base AMI.
    type: str
    default: debian-12-amd64-*
  ami_owner:
    description: The owner of the base AMI.
    type: str
    default: "136693071363"
  use_baked:
    description: Boot a baked image of the current recipe when one exists.
    type: bool
    default: true
  baked_ami_id:
    description: A baked image to boot whatever its recipe (no digest is computed).
    type: str
    default: ""
  baked_name:
    description: The value of O(image_tag) that marks the baked images.
    type: str
    default: dynatrain-node
  image_tag:
    description: The tag key naming a baked image.
    type: str
    required: true
  recipe_tag:
    description: The tag key holding a baked image's recipe digest.
    type: str
    required: true
  roles_dir:
    description: The directory that holds the baked roles (the collection's roles/).
    type: path
    required: true
  recipe_roles:
    description: The roles whose files the recipe covers.
    type: list
    elements: str
    required: true
  wheelhouse_dir:
    description: The controller wheelhouse whose wheel names the recipe covers; empty for none.
    type: str
    default: ""
  instance_type:
    description: The builder's instance type (part of the recipe).
    type: str
    required: true
  engine:
    description: The engine whose venv the image holds (part of the recipe).
    type: str
    required: true
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - amazon.aws.common.modules
  - amazon.aws.region.modules
  - amazon.aws.boto3
"""

EXAMPLES = r"""
- name: Choose the node image
  dynatrain.elastic.node_image_choose:
    image_tag: "dynatrain:image"
    recipe_tag: "dynatrain:recipe"
    roles_dir: "{{ role_path }}/.."
    recipe_roles: [node_base, cuda, efs, mxnet, torch, launcher]
    wheelhouse_dir: /srv/wheelhouse
    instance_type: c5.xlarge
    engine: mxnet
  register: chosen
"""

RETURN = r"""
base_id:
  description: The base AMI.
  type: str
  returned: success
root_device:
  description: The base AMI's root device name (C(/dev/xvda) when it has none).
  type: str
  returned: success
recipe:
  description: The recipe digest; empty when O(baked_ami_id) is given or O(use_baked) is false.
  type: str
  returned: success
current_image_id:
  description: The newest baked image of this recipe, or empty.
  type: str
  returned: success
image_id:
  description: The image to boot.
  type: str
  returned: success
is_baked:
  description: Whether RV(image_id) is a baked image (this recipe's, or O(baked_ami_id)).
  type: bool
  returned: success
stale:
  description: No baked image of this recipe, but baked images of others exist.
  type: bool
  returned: success
stale_image_id:
  description: The newest baked image when RV(stale), else empty.
  type: str
  returned: success
"""

try:
    import botocore
except ImportError:
    pass  # handled by AnsibleAWSModule

from ansible_collections.amazon.aws.plugins.module_utils.modules import AnsibleAWSModule
from ansible_collections.amazon.aws.plugins.module_utils.retries import AWSRetry
from ansible_collections.amazon.aws.plugins.module_utils.tagging import boto3_tag_list_to_ansible_dict

from ansible_collections.dynatrain.elastic.plugins.module_utils import node_image_recipe
from ansible_collections.dynatrain.elastic.plugins.module_utils.aws_task import TaskFailed, run_module


def _images(client, **kwargs):
    """DescribeImages, newest last (by creation date, as the role's ``sort(attribute='creation_date')``)."""
    try:
        images = client.describe_images(aws_retry=True, **kwargs).get("Images", [])
    except botocore.exceptions.ClientError as e:
        # an ami_id that does not exist is "not found", said by the caller
        if e.response.get("Error", {}).get("Code", "").startswith("InvalidAMIID"):
            return []
        raise
    return sorted(images, key=lambda i: i.get("CreationDate", ""))


def base_image(client, ami_id, ami_name, ami_owner):
    if ami_id:
        found = _images(client, ImageIds=[ami_id], Filters=[{"Name": "state", "Values": ["available"]}])
    else:
        found = _images(client, Owners=[ami_owner], Filters=[{"Name": "name", "Values": [ami_name]},
                                                             {"Name": "state", "Values": ["available"]}])
    return found[-1] if found else {}


def choose(baked_images, recipe_tag, recipe, baked_ami_id, base_id):
    """(image_id, current_image_id, is_baked, stale, stale_image_id) from the baked images (oldest first)."""
    current = [i for i in baked_images
               if boto3_tag_list_to_ansible_dict(i.get("Tags", [])).get(recipe_tag) == recipe and recipe]
    current_id = current[-1]["ImageId"] if current else ""
    stale = not current and bool(baked_images)
    return (baked_ami_id or current_id or base_id, current_id, bool(baked_ami_id or current_id), stale,
            baked_images[-1]["ImageId"] if stale else "")


ARGUMENT_SPEC = dict(
    ami_id=dict(type="str", default=""),
    ami_name=dict(type="str", default="debian-12-amd64-*"),
    ami_owner=dict(type="str", default="136693071363"),
    use_baked=dict(type="bool", default=True),
    baked_ami_id=dict(type="str", default=""),
    baked_name=dict(type="str", default="dynatrain-node"),
    image_tag=dict(type="str", required=True),
    recipe_tag=dict(type="str", required=True),
    roles_dir=dict(type="path", required=True),
    recipe_roles=dict(type="list", elements="str", required=True),
    wheelhouse_dir=dict(type="str", default=""),
    instance_type=dict(type="str", required=True),
    engine=dict(type="str", required=True),
)


def run(api, params, _check_mode):
    """The module's work (module_utils/aws_task.py): api is the module or its action plugin. Read-only."""
    p = params
    client = api.client("ec2", retry_decorator=AWSRetry.jittered_backoff())
    try:
        base = base_image(client, p["ami_id"], p["ami_name"], p["ami_owner"])
        if not base:
            raise TaskFailed("%s in %s: set dt_ami_id, or dt_ami_name/dt_ami_owner (on the local cloud run "
                             "`python -m localcloud up` first)."
                             % (("No available AMI " + p["ami_id"]) if p["ami_id"] else
                                ("No AMI named %s owned by %s" % (p["ami_name"], p["ami_owner"])), api.region))
        recipe, baked = "", []
        if p["use_baked"] and not p["baked_ami_id"]:
            recipe = node_image_recipe.digest(node_image_recipe.recipe(
                p["roles_dir"], p["recipe_roles"], p["wheelhouse_dir"], base["ImageId"], p["instance_type"],
                p["engine"]))
            baked = _images(client, Owners=["self"],
                            Filters=[{"Name": "tag:" + p["image_tag"], "Values": [p["baked_name"]]},
                                     {"Name": "state", "Values": ["available"]}])
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
        raise TaskFailed("Could not look up the node images", exception=e) from e
    image_id, current_id, is_baked, stale, stale_id = choose(baked, p["recipe_tag"], recipe, p["baked_ami_id"],
                                                             base["ImageId"])
    return dict(changed=False, base_id=base["ImageId"], root_device=base.get("RootDeviceName") or "/dev/xvda",
                recipe=recipe, current_image_id=current_id, image_id=image_id, is_baked=is_baked, stale=stale,
                stale_image_id=stale_id)


def main():
    run_module(AnsibleAWSModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True), run)


if __name__ == "__main__":
    main()
