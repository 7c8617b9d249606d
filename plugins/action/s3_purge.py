# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""s3_purge in the controller's process (plugin_utils/aws_action.py says why); its logic and documentation: plugins/modules/s3_purge.py."""
from __future__ import annotations

from ansible_collections.dynatrain.elastic.plugins.modules import s3_purge
from ansible_collections.dynatrain.elastic.plugins.plugin_utils.aws_action import AWSModuleAction


class ActionModule(AWSModuleAction):
    MODULE = s3_purge
