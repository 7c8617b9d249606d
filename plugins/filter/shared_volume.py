# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""Names on the shared volume for the roles and the playbooks; their one home is module_utils/shared_volume.py."""

from __future__ import annotations

import posixpath

from ansible.errors import AnsibleFilterError

from ansible_collections.dynatrain.elastic.plugins.module_utils import shared_volume


def prepare_data_marker(ip, directory=""):
    """The prepare-data success marker of the node ``ip``: its file name, or its path under ``directory``."""
    try:
        name = shared_volume.prepare_data_marker(ip)
    except shared_volume.HostWorkerError as exc:
        raise AnsibleFilterError(str(exc)) from None
    return posixpath.join(str(directory), name) if directory else name


def wheelhouse_dir(efs_mount):
    """The shared volume's wheelhouse under the mount point ``efs_mount``."""
    return posixpath.join(str(efs_mount), shared_volume.WHEELHOUSE_DIR)


class FilterModule:
    def filters(self):
        return {"prepare_data_marker": prepare_data_marker, "wheelhouse_dir": wheelhouse_dir}
