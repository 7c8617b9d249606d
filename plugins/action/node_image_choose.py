# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""node_image_choose in the controller's process (plugin_utils/aws_action.py says why); its logic and documentation: plugins/modules/node_image_choose.py."""
from __future__ import annotations

from ansible_collections.dynatrain.elastic.plugins.modules import node_image_choose
from ansible_collections.dynatrain.elastic.plugins.plugin_utils.aws_action import AWSModuleAction


class ActionModule(AWSModuleAction):
    MODULE = node_image_choose
