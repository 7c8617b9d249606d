# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""AWS clients for this collection's controller-side plugins (the inventory and the AWS modules' actions), with
one botocore data loader per process.

Why: a client's creation parses its service's model (botocore's JSON: ~0.15 s for EC2 on two cores), and
amazon.aws makes a new session, so a new loader, per client. The inventory makes its EC2 clients in
ansible-playbook's own process before the first task, and every task runs in a fork of that process: with the
loader kept here, each AWS action of a run finds the EC2 model parsed already (~0.05 s a client). The loader holds
service models only: the credentials, the region and the endpoint stay each client's, resolved by amazon.aws's
own helpers as its ``client()`` resolves them (options, aliases, environment, profile).
"""
from __future__ import annotations

try:
    import boto3
    import botocore.config
    import botocore.exceptions
    import botocore.session
except ImportError:
    pass  # the plugins say so (amazon.aws's HAS_BOTO3 / require_aws_sdk)

from ansible_collections.amazon.aws.plugins.module_utils.botocore import _get_user_agent_string
from ansible_collections.amazon.aws.plugins.module_utils.botocore import _merge_botocore_config
from ansible_collections.amazon.aws.plugins.module_utils.retries import RetryingBotoClientWrapper
from ansible_collections.amazon.aws.plugins.plugin_utils.base import AWSPluginBase
from ansible_collections.amazon.aws.plugins.plugin_utils.botocore import get_aws_connection_info

_LOADER = None


def session(profile=None):
    """A boto3 session of its own (credentials, profile) on the process's one data loader."""
    global _LOADER  # pylint: disable=global-statement
    core = botocore.session.Session()
    if _LOADER is None:
        _LOADER = core.get_component("data_loader")
    else:
        core.register_component("data_loader", _LOADER)
    made = boto3.session.Session(profile_name=profile, botocore_session=core)
    # boto3 appends its own data path to the loader of each session: keep one of each
    paths = _LOADER.search_paths
    paths[:] = list(dict.fromkeys(paths))
    return made


def client(plugin, service, retry_decorator=None, **extra_params):
    """What amazon.aws's plugin ``client()`` returns (the same connection settings, user agent, errors), made on
    the shared loader."""
    region, endpoint_url, connect = get_aws_connection_info(plugin)
    params = dict(region=region, endpoint=endpoint_url, **connect)
    params.update(extra_params)
    region, endpoint = params.pop("region"), params.pop("endpoint")
    profile = params.pop("profile_name", None)
    config = botocore.config.Config(user_agent=_get_user_agent_string())
    for key in ("config", "aws_config"):
        config = _merge_botocore_config(config, params.pop(key, None))
    try:
        conn = session(profile).client(service, config=config, region_name=region, endpoint_url=endpoint, **params)
    except botocore.exceptions.NoRegionError:
        plugin.fail_aws("The %s plugin requires a region and none was found in configuration, environment variables"
                        " or module parameters" % getattr(plugin, "ansible_name", "dynatrain.elastic"))
    except (ValueError, botocore.exceptions.BotoCoreError) as e:
        plugin.fail_aws("Couldn't connect to AWS", exception=e)
    return conn if retry_decorator is None else RetryingBotoClientWrapper(conn, retry_decorator)


class SharedLoaderClient(AWSPluginBase):  # pylint: disable=too-few-public-methods
    """amazon.aws's plugin base whose ``client()`` is made on the shared loader: a plugin lists it after its amazon.aws
    base (``class InventoryModule(AWSInventoryBase, SharedLoaderClient)``), so that base's own ``client()`` (the
    inventory's frozen credentials) comes first and hands over to this one."""

    def client(self, service, retry_decorator=None, **extra_params):
        return client(self, service, retry_decorator, **extra_params)
