# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""preflight_az in the controller's process (plugin_utils/aws_action.py says why); its logic and documentation: plugins/modules/preflight_az.py."""
from __future__ import annotations

from ansible_collections.dynatrain.elastic.plugins.modules import preflight_az
from ansible_collections.dynatrain.elastic.plugins.plugin_utils.aws_action import AWSModuleAction


class ActionModule(AWSModuleAction):
    MODULE = preflight_az
