"""AMIs made with CreateImage are podman images, so a baked node image works locally.

On EC2, CreateImage snapshots an instance's root volume into a new AMI and
RunInstances with that AMI boots a copy of it. Here an instance is a podman
container, so:

- CreateImage (moto records the AMI) also runs `podman commit` of the
  instance's container into `localhost/dynatrain-ami:<ami-id>`, labelled with
  the cloud's state directory and the AMI id.
- RunInstances with that AMI id: the reconciler starts the container from that
  image (`image_for`) instead of the stock node image.
- DeregisterImage removes the podman image (kept while a container still
  uses it: `down` removes it with the containers).
- `localcloud down`, and `up` for a previous run's leftovers, remove every
  image of this cloud (`remove_all`): moto's AMI records die with the daemon.

A commit keeps what the roles wrote on the root file system (packages, the
venv, the node runtime) and nothing of the instance: host keys are made again
by localcloud-init at the first boot of each instance (its marker holds the
instance id they belong to), the key pair's key and sshd's address at each
boot, and the instance directory and EFS are bind mounts, which a commit never
contains. A stopped instance can be imaged too (its container is kept).
"""

from __future__ import annotations

import json
import logging

from . import config, podman

log = logging.getLogger("localcloud.baked_images")

REPOSITORY = "localhost/dynatrain-ami"
AMI_LABEL = "dynatrain.localcloud.ami"
# A commit of a node with a venv takes a while on a busy host.
COMMIT_TIMEOUT_S = 600

_APPLIED = {"done": False}


def tag(ami_id: str) -> str:
    """The podman image of an AMI made by CreateImage."""
    return "%s:%s" % (REPOSITORY, ami_id)


def image_for(ami_id: str | None) -> str:
    """The podman image an instance of ami_id boots: its own when CreateImage made one."""
    if ami_id and podman.image_exists(tag(ami_id)):
        return tag(ami_id)
    return config.IMAGE


def commit_args(instance_id: str, ami_id: str, home: str) -> list[str]:
    """`podman commit` of the instance's container (paused while it is copied, like a no-reboot image)."""
    return [
        "commit",
        "--pause=true",
        "--change",
        "LABEL %s=1" % config.LABEL,
        "--change",
        "LABEL %s=%s" % (config.HOME_LABEL, home),
        "--change",
        "LABEL %s=%s" % (AMI_LABEL, ami_id),
        instance_id,
        tag(ami_id),
    ]


def commit(instance_id: str, ami_id: str, home: str | None = None) -> bool:
    """Make the AMI's podman image from the instance's container. False when it has none."""
    home = home or config.home()
    if instance_id not in podman.list_containers(home):
        log.warning("%s: CreateImage %s: the instance has no node here; the AMI boots the stock image", instance_id, ami_id)
        return False
    podman.run(commit_args(instance_id, ami_id, home), timeout=COMMIT_TIMEOUT_S)
    log.info("%s: CreateImage %s: committed to %s", instance_id, ami_id, tag(ami_id))
    return True


def remove(ami_id: str) -> bool:
    """Remove the AMI's image; an image a container still runs from stays (`down` removes it)."""
    if not podman.image_exists(tag(ami_id)):
        return False
    proc = podman.run(["rmi", tag(ami_id)], check=False)
    if proc.returncode != 0:
        log.warning("DeregisterImage %s: podman image kept (%s)", ami_id, proc.stderr.strip())
        return False
    log.info("DeregisterImage %s: removed %s", ami_id, tag(ami_id))
    return True


def list_images(home: str) -> list[str]:
    """Ids of this cloud's AMI images."""
    # One label filter only: podman ORs repeated label filters, so "home=X" + "is an AMI" matched
    # every AMI image of every cloud on the machine (a second cloud's `down` removed this one's).
    out = podman.run(
        ["images", "--format", "json", "--filter", "label=%s=%s" % (config.HOME_LABEL, home)]
    ).stdout.strip() or "[]"
    return [img["Id"] for img in json.loads(out)
            if img.get("Id") and AMI_LABEL in (img.get("Labels") or {})
            and (img.get("Labels") or {}).get(config.HOME_LABEL) == home]


def remove_all(home: str | None = None) -> list[str]:
    """Remove every AMI image of this cloud (after its containers are gone)."""
    home = home or config.home()
    ids = list_images(home)
    for image_id in ids:
        podman.run(["rmi", "-f", image_id], check=False, timeout=120)
    if ids:
        log.info("removed %d AMI image(s)", len(ids))
    return ids


def apply(home: str | None = None) -> None:
    """Hook CreateImage and DeregisterImage of moto's EC2 backend (before the server's first request)."""
    if _APPLIED["done"]:
        return
    from moto.ec2.models.amis import AmiBackend

    create_image = AmiBackend.create_image
    deregister_image = AmiBackend.deregister_image

    def create_image_and_commit(self, instance_id, name, description, tag_specifications, *args, **kwargs):
        # amazon.aws.ec2_ami tags the snapshots too; moto has no snapshot of a created image.
        tag_specifications = [t for t in tag_specifications or [] if t.get("ResourceType") != "snapshot"]
        ami = create_image(self, instance_id, name, description, tag_specifications, *args, **kwargs)
        try:
            commit(instance_id, ami.id, home)
        except Exception:
            # EC2's CreateImage fails as a whole: no AMI that boots something else.
            self.amis.pop(ami.id, None)
            raise
        return ami

    def deregister_image_and_remove(self, ami_id, *args, **kwargs):
        result = deregister_image(self, ami_id, *args, **kwargs)
        remove(ami_id)
        return result

    AmiBackend.create_image = create_image_and_commit
    AmiBackend.deregister_image = deregister_image_and_remove
    _APPLIED["done"] = True
