"""dynatrain.elastic.node_image_choose (issue 43): the node image in one module run: the base AMI, the recipe
digest, and the newest baked image of that recipe (else the base AMI); a baked image of another recipe is stale."""
from __future__ import annotations

import json
import os

import boto3
import pytest
from moto import mock_aws

from ansible.module_utils.testing import patch_module_args

from ansible_collections.dynatrain.elastic.plugins.module_utils import node_image_recipe
from ansible_collections.dynatrain.elastic.plugins.modules import node_image_choose

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
ROLES = ["node_base", "launcher"]


def choose(capsys, **params):
    args = {"image_tag": "dynatrain:image", "recipe_tag": "dynatrain:recipe", "roles_dir": os.path.join(ROOT, "roles"),
            "recipe_roles": ROLES, "instance_type": "c5.xlarge", "engine": "mxnet", "region": "us-east-1"}
    args.update(params)
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            node_image_choose.main()
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def ec2(monkeypatch):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    with mock_aws():
        yield boto3.client("ec2", region_name="us-east-1")


def bake(ec2, base, recipe):
    iid = ec2.run_instances(ImageId=base, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    image = ec2.create_image(InstanceId=iid, Name="dynatrain-node-%s" % recipe[:8])["ImageId"]
    ec2.create_tags(Resources=[image], Tags=[{"Key": "dynatrain:image", "Value": "dynatrain-node"},
                                             {"Key": "dynatrain:recipe", "Value": recipe}])
    return image


def test_no_baked_image_boots_the_base_ami_and_says_the_recipe(capsys, ec2):
    base = ec2.describe_images(Owners=["amazon"])["Images"][0]
    out = choose(capsys, ami_id=base["ImageId"])
    assert out["image_id"] == out["base_id"] == base["ImageId"] and out["root_device"] == base["RootDeviceName"]
    assert not out["is_baked"] and not out["stale"] and out["current_image_id"] == ""
    expected = node_image_recipe.digest(node_image_recipe.recipe(os.path.join(ROOT, "roles"), ROLES, "", base["ImageId"],
                                                                 "c5.xlarge", "mxnet"))
    assert out["recipe"] == expected


def test_the_newest_image_of_this_recipe_is_booted_and_another_recipe_is_stale(capsys, ec2):
    base = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    recipe = choose(capsys, ami_id=base)["recipe"]
    old = bake(ec2, base, "0" * 64)
    out = choose(capsys, ami_id=base)
    assert out["stale"] and out["stale_image_id"] == old and out["image_id"] == base and not out["is_baked"]
    current = bake(ec2, base, recipe)
    out = choose(capsys, ami_id=base)
    assert out["image_id"] == out["current_image_id"] == current and out["is_baked"] and not out["stale"]
    # another engine is another recipe: the mxnet image is not booted by a torch cluster
    out = choose(capsys, ami_id=base, engine="torch")
    assert out["image_id"] == base and out["stale"]
    # a given baked image wins and no digest is computed; without use_baked, the base AMI
    assert choose(capsys, ami_id=base, baked_ami_id=old)["image_id"] == old
    out = choose(capsys, ami_id=base, use_baked=False)
    assert out["image_id"] == base and out["recipe"] == "" and not out["is_baked"]


def test_the_base_ami_by_name_and_owner_and_a_missing_one_refused(capsys, ec2):
    images = ec2.describe_images(Owners=["amazon"])["Images"]
    named = images[0]
    out = choose(capsys, ami_name=named["Name"], ami_owner=named["OwnerId"], use_baked=False)
    assert out["base_id"] == named["ImageId"]
    out = choose(capsys, ami_name="no-such-image-*", ami_owner="136693071363")
    assert out["failed"] and "No AMI named no-such-image-* owned by 136693071363 in us-east-1" in out["msg"]
    out = choose(capsys, ami_id="ami-00000000000000000")
    assert out["failed"] and "No available AMI ami-00000000000000000" in out["msg"]
