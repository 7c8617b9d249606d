"""localcloud.baked_images: CreateImage -> podman commit, the image an AMI boots, cleanup (podman faked)."""
from __future__ import annotations

import json
import subprocess

import pytest

from localcloud import baked_images, config, podman


class FakePodman:
    def __init__(self, containers=(), images_=()):
        self.containers = set(containers)
        self.images = dict(images_)  # tag -> (id, labels)
        self.calls = []

    def run(self, args, check=True, timeout=120, input=None):
        self.calls.append(list(args))
        out, rc = "", 0
        if args[:2] == ["image", "exists"]:
            rc = 0 if args[2] in self.images else 1
        elif args[0] == "commit":
            labels = dict(a.split(" ", 1)[1].split("=", 1) for a in args[1:-2] if a.startswith("LABEL "))
            self.images[args[-1]] = ("id-" + args[-1].rsplit(":", 1)[1], labels)
        elif args[0] == "rmi":
            hit = [t for t, (i, _labels) in self.images.items() if args[-1] in (t, i)]
            rc = 0 if hit else 1
            for t in hit:
                del self.images[t]
        elif args[0] == "images":
            # like podman 4: repeated label filters are ORed
            want = [f.split("=", 1)[1] for f in args if f.startswith("label=")]
            out = json.dumps([{"Id": i, "Labels": labels} for i, labels in self.images.values()
                              if any(w.split("=", 1)[0] in labels
                                     and ("=" not in w or labels[w.split("=", 1)[0]] == w.split("=", 1)[1])
                                     for w in want)])
        elif args[0] == "ps":
            out = json.dumps([{"Names": [c], "State": "running"} for c in sorted(self.containers)])
        return subprocess.CompletedProcess(args, rc, out, "")


@pytest.fixture
def fake(monkeypatch):
    f = FakePodman(containers=["i-builder"])
    monkeypatch.setattr(podman, "run", f.run)
    return f


def test_an_ami_without_image_boots_the_stock_node_image(fake):
    assert baked_images.image_for("ami-12345678") == config.IMAGE
    assert baked_images.image_for(None) == config.IMAGE


def test_create_image_commits_the_builder_and_its_instances_boot_it(fake):
    assert baked_images.commit("i-builder", "ami-abc", home="/state")
    commit = next(c for c in fake.calls if c[0] == "commit")
    assert commit[-2:] == ["i-builder", "localhost/dynatrain-ami:ami-abc"]
    assert "LABEL %s=/state" % config.HOME_LABEL in commit
    assert baked_images.image_for("ami-abc") == "localhost/dynatrain-ami:ami-abc"


def test_create_image_of_an_instance_without_node_commits_nothing(fake):
    assert not baked_images.commit("i-elsewhere", "ami-abc", home="/state")
    assert baked_images.image_for("ami-abc") == config.IMAGE


def test_deregister_and_down_remove_only_this_clouds_images(fake):
    baked_images.commit("i-builder", "ami-a", home="/state")
    baked_images.commit("i-builder", "ami-b", home="/state")
    fake.images["localhost/dynatrain-ami:ami-other"] = ("id-other", {config.HOME_LABEL: "/other", baked_images.AMI_LABEL: "ami-other"})
    assert baked_images.remove("ami-a")
    assert baked_images.image_for("ami-a") == config.IMAGE
    assert baked_images.remove_all("/state") == ["id-ami-b"]
    assert list(fake.images) == ["localhost/dynatrain-ami:ami-other"]


def test_moto_create_image_commits_and_deregister_removes(fake, monkeypatch):
    from moto.ec2.models.amis import AmiBackend

    monkeypatch.setattr(baked_images, "_APPLIED", {"done": False})
    monkeypatch.setattr(AmiBackend, "create_image", AmiBackend.create_image)
    monkeypatch.setattr(AmiBackend, "deregister_image", AmiBackend.deregister_image)
    baked_images.apply("/state")
    import boto3
    from moto import mock_aws

    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        iid = ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
        fake.containers.add(iid)
        new = ec2.create_image(InstanceId=iid, Name="baked")["ImageId"]
        assert baked_images.image_for(new) == baked_images.tag(new)
        ec2.deregister_image(ImageId=new)
        assert baked_images.image_for(new) == config.IMAGE


def test_down_of_one_cloud_leaves_another_clouds_images(fake):
    """Two clouds on one machine (a test cloud beside the e2e's): remove_all is per state directory."""
    assert baked_images.commit("i-builder", "ami-mine", home="/state-a")
    assert baked_images.commit("i-builder", "ami-theirs", home="/state-b")
    assert baked_images.remove_all(home="/state-a") == ["id-ami-mine"]
    assert baked_images.image_for("ami-theirs") == "localhost/dynatrain-ami:ami-theirs"
