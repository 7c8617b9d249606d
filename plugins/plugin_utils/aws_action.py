# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""Run one of this collection's AWS modules inside the controller's process: the base of its action plugin.

Why: these modules only ever talk to AWS from the controller, and a module run there forks a Python that imports
boto3 and amazon.aws again (0.5-1 s each on a 2-core machine, several on the way of every add); the controller has
boto3 imported already, so the same code costs one client's creation. The module file stays the one home of the
logic and the documentation (``module_utils/aws_task.py``: ``ARGUMENT_SPEC`` and ``run``). The task's arguments are
checked against the same spec as AnsibleAWSModule's, amazon.aws's common options (credentials, profile, region,
endpoint, their aliases and environment fallbacks) included, and ``client()`` and ``region`` are amazon.aws's own
for plugins: the credentials, the region and the endpoint are resolved as the module resolves them (the client made
on the process's one botocore loader: ``plugin_utils/aws_client.py``).
"""
from __future__ import annotations

from ansible.module_utils.common.dict_transformations import camel_dict_to_snake_dict
from ansible.module_utils.common.text.converters import to_native
from ansible.plugins.action import ActionBase

from ansible_collections.amazon.aws.plugins.module_utils.modules import aws_argument_spec

from ansible_collections.dynatrain.elastic.plugins.module_utils.aws_task import TaskFailed
from ansible_collections.dynatrain.elastic.plugins.plugin_utils.aws_client import SharedLoaderClient


class AWSModuleAction(ActionBase, SharedLoaderClient):
    """``MODULE``: the module (its ``ARGUMENT_SPEC`` and ``run``) this action runs in place of a module run."""

    MODULE = None
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._aws_params = {}
        self.ansible_name = self._task.action

    def get_options(self):
        """The validated arguments (amazon.aws's connection helpers read them through this)."""
        return self._aws_params

    def _do_fail(self, message):
        raise TaskFailed(message)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        spec = aws_argument_spec()
        spec.update(self.MODULE.ARGUMENT_SPEC)
        _validation, self._aws_params = self.validate_argument_spec(argument_spec=spec)
        try:
            result.update(self.MODULE.run(self, self._aws_params, bool(self._task.check_mode)))
        except TaskFailed as e:
            msg = "%s: %s" % (e.msg, to_native(e.exception)) if e.exception is not None else e.msg
            result.update(e.result, failed=True, msg=msg)
            # AWS's answer as the module's fail_json_aws returns it (error.code, error.message, ...): a caller reads
            # the error code the same way whichever way the module ran (filter launch_error)
            response = getattr(e.exception, "response", None)
            if isinstance(response, dict):
                result.update(camel_dict_to_snake_dict(response))
        return result
