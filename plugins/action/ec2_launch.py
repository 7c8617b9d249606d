# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""ec2_launch in the controller's process (plugin_utils/aws_action.py says why); its logic and documentation: plugins/modules/ec2_launch.py."""
from __future__ import annotations

from ansible_collections.dynatrain.elastic.plugins.modules import ec2_launch
from ansible_collections.dynatrain.elastic.plugins.plugin_utils.aws_action import AWSModuleAction


class ActionModule(AWSModuleAction):
    MODULE = ec2_launch
