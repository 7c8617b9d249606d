# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""The contract between this collection's AWS modules and their controller-side action plugins.

Such a module is one home for both ways it runs: it exposes ``ARGUMENT_SPEC`` (its options, without amazon.aws's
common ones) and ``run(api, params, check_mode)``, which returns the result and raises ``TaskFailed`` to fail.
``api`` is anything with amazon.aws's ``client(service, retry_decorator=None)`` and ``region``: the
AnsibleAWSModule (``main()``, through ``run_module``) or the action plugin (``plugin_utils/aws_action.py``).
"""
from __future__ import annotations


class TaskFailed(Exception):
    """Fail the task with ``msg`` (and the AWS error ``exception``, when there is one) and ``result``."""

    def __init__(self, msg, exception=None, **result):
        super().__init__(msg)
        self.msg, self.exception, self.result = msg, exception, result


def run_module(module, run):
    """main() of such a module: run it with the module as its api, exit or fail as it says."""
    try:
        result = run(module, module.params, module.check_mode)
    except TaskFailed as e:
        if e.exception is not None:
            module.fail_json_aws(e.exception, msg=e.msg, **e.result)
        module.fail_json(msg=e.msg, **e.result)
    module.exit_json(**result)
