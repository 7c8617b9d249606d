"""Fill gaps in moto that the real amazon.aws/community.aws modules hit.

community.aws.efs and efs_info call EFS's legacy tag API (DescribeTags,
CreateTags, DeleteTags), which moto 5 does not route. They are thin aliases
of the resource-tag API moto does implement, so we add them here instead of
re-writing EFS calls by hand in the playbooks.

moto ignores a launch template's network interface (subnet, security groups)
and metadata options; EC2 applies them. Without that, instances launched from
our templates would get random 10.x addresses instead of loopback ones.

`apply()` must run before the moto server handles its first request.
"""

import json

_APPLIED = False


def _describe_tags(self):
    fs_id = self._get_param("FileSystemId")
    tags = self.efs_backend.list_tags_for_resource(fs_id)
    return json.dumps({"Tags": tags}), {"Content-Type": "application/json"}


def _create_tags(self):
    fs_id = self._get_param("FileSystemId")
    tags = {t["Key"]: t.get("Value") for t in (self._get_param("Tags") or [])}
    self.efs_backend.tag_resource(fs_id, tags)
    return "", {"status": 204}


def _delete_tags(self):
    fs_id = self._get_param("FileSystemId")
    self.efs_backend.untag_resource(fs_id, self._get_param("TagKeys") or [])
    return "", {"status": 204}


def _patch_launch_template_network():
    from moto.ec2.models.instances import InstanceBackend

    original = InstanceBackend.run_instances

    def run_instances(self, image_id, count, user_data, security_group_names, **kwargs):
        template_arg = kwargs.get("launch_template")
        if template_arg and not kwargs.get("nics") and not kwargs.get("subnet_id"):
            data = self._get_template_from_args(template_arg).data
            nics = [dict(n) for n in data.get("NetworkInterfaces") or []]
            primary = next((n for n in nics if str(n.get("DeviceIndex", "0")) == "0"), None)
            if primary:
                # EC2 takes subnet, groups and public-IP choice from the template's
                # primary interface; moto would give a random 10.x address.
                kwargs["subnet_id"] = primary.get("SubnetId")
                if not kwargs.get("security_group_ids") and primary.get("Groups"):
                    kwargs["security_group_ids"] = list(primary["Groups"])
                if kwargs.get("associate_public_ip") is None and "AssociatePublicIpAddress" in primary:
                    kwargs["associate_public_ip"] = str(primary["AssociatePublicIpAddress"]).lower() == "true"
            if not kwargs.get("metadata_options") and data.get("MetadataOptions"):
                kwargs["metadata_options"] = dict(data["MetadataOptions"])
        return original(self, image_id, count, user_data, security_group_names, **kwargs)

    InstanceBackend.run_instances = run_instances


def _delete_launch_template_versions(self):
    # moto has no DeleteLaunchTemplateVersions; amazon.aws.ec2_launch_template
    # calls it before DeleteLaunchTemplate. Versions are positional in moto, so
    # they are reported deleted and go away with the template itself.
    from moto.core.responses import ActionResult

    name = self._get_param("LaunchTemplateName")
    tid = self._get_param("LaunchTemplateId")
    template = self.ec2_backend.get_launch_template_by_name(name) if name else self.ec2_backend.get_launch_template(tid)
    versions = self._get_param("LaunchTemplateVersions", []) or []
    deleted = [
        {"LaunchTemplateId": template.id, "LaunchTemplateName": template.name, "VersionNumber": int(v)}
        for v in versions
    ]
    return ActionResult({"SuccessfullyDeletedLaunchTemplateVersions": deleted, "UnsuccessfullyDeletedLaunchTemplateVersions": []})


def _patch_launch_template_tags():
    # moto copies the template's own tags (TagSpecifications of type
    # launch-template) into version 1's data; EC2 does not. The copy made
    # amazon.aws.ec2_launch_template see a change on its second run.
    from moto.ec2.models.launch_templates import LaunchTemplateBackend

    original = LaunchTemplateBackend.create_launch_template

    def create_launch_template(self, name, description, template_data, tag_spec):
        specs = [t for t in template_data.get("TagSpecifications") or []
                 if t.get("ResourceType") != "launch-template"]
        if specs:
            template_data["TagSpecifications"] = specs
        else:
            template_data.pop("TagSpecifications", None)
        return original(self, name, description, template_data, tag_spec)

    LaunchTemplateBackend.create_launch_template = create_launch_template


def apply():
    """Register the legacy EFS tag operations with moto (idempotent)."""
    global _APPLIED
    if _APPLIED:
        return
    from moto.efs import urls
    from moto.efs.responses import EFSResponse

    EFSResponse.describe_tags = _describe_tags
    EFSResponse.create_tags = _create_tags
    EFSResponse.delete_tags = _delete_tags
    for path in (
        "/2015-02-01/tags/<file_system_id>/",
        "/2015-02-01/create-tags/<file_system_id>",
        "/2015-02-01/delete-tags/<file_system_id>",
    ):
        urls.url_paths[path] = urls.response.dispatch
    _patch_launch_template_network()
    _patch_launch_template_tags()
    from moto.ec2.responses.launch_templates import LaunchTemplates

    LaunchTemplates.delete_launch_template_versions = _delete_launch_template_versions
    _APPLIED = True
