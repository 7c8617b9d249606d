# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""host_key_check in the controller's process (plugin_utils/aws_action.py says why); its logic and documentation: plugins/modules/host_key_check.py."""
from __future__ import annotations

from ansible_collections.dynatrain.elastic.plugins.modules import host_key_check
from ansible_collections.dynatrain.elastic.plugins.plugin_utils.aws_action import AWSModuleAction


class ActionModule(AWSModuleAction):
    MODULE = host_key_check
