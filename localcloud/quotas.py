"""Service Quotas for EC2 on the local cloud, answered like AWS (issue 12).

moto's Service Quotas knows only `vpc`; preflight reads the EC2 vCPU quotas
(`GetServiceQuota` with service code `ec2`), so this module answers the Running
On-Demand and Spot vCPU quotas of each instance family class with AWS's quota codes
and names, at values a test can set: `python -m localcloud quota ec2 L-1216C47A 32`
(the daemon's control endpoint, POST /quota), or `set_quota` in-process.

Quotas are per region on AWS, and so here: `quota --region us-west-2 ec2 L-1216C47A 0` takes
us-west-2's capacity away and leaves the other regions as they were; without --region the value
holds in every region (a region's own value set earlier is dropped).
"""
from __future__ import annotations

import re
import threading

# AWS's codes and names (Service Quotas console, service "Amazon Elastic Compute Cloud (Amazon EC2)"):
# the families a training cluster uses (Standard for CPU, G/VT and P for GPUs), on-demand and spot.
EC2_QUOTAS = {
    "L-1216C47A": "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances",
    "L-DB2E81BA": "Running On-Demand G and VT instances",
    "L-417A185B": "Running On-Demand P instances",
    "L-34B43A08": "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests",
    "L-3819A6DF": "All G and VT Spot Instance Requests",
    "L-7212CCBC": "All P Spot Instance Requests",
}
# A grown account's values (a new account starts far lower); tests set their own.
DEFAULT_VCPUS = 256.0

_lock = threading.Lock()
# (service, code, region or None for every region) -> vCPUs
_values: dict[tuple[str, str, str | None], float] = {}
# As playbooks/preflight.yml checks a region name.
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-[0-9]+$")


def set_quota(service_code, quota_code, value, region=None):
    """Set one quota's value (vCPUs) in ``region``, or in every region when it is None; returns it.

    Unknown codes are refused like AWS's NoSuchResource. Setting every region drops the
    regions' own values, so the value then holds everywhere.
    """
    if service_code != "ec2" or quota_code not in EC2_QUOTAS:
        raise KeyError("no quota %s/%s (known: ec2 %s)" % (service_code, quota_code, ", ".join(sorted(EC2_QUOTAS))))
    if region is not None and not (isinstance(region, str) and _REGION.match(region)):
        raise ValueError("not a region name: %r (e.g. us-west-2)" % (region,))
    value = float(value)
    if value < 0:
        raise ValueError("a quota is not negative: %s" % value)
    with _lock:
        if region is None:
            for key in [k for k in _values if k[:2] == (service_code, quota_code)]:
                del _values[key]
        _values[(service_code, quota_code, region)] = value
    return value


def value_in(service_code, quota_code, region):
    """The quota's vCPUs in ``region``: its own value, else the every-region one, else the default."""
    with _lock:
        for key in ((service_code, quota_code, region), (service_code, quota_code, None)):
            if key in _values:
                return _values[key]
    return DEFAULT_VCPUS


def reset():
    with _lock:
        _values.clear()


def quota(service_code, quota_code, region, account_id):
    """The quota as GetServiceQuota returns it, or None when it is not an EC2 quota we answer."""
    if service_code != "ec2" or quota_code not in EC2_QUOTAS:
        return None
    value = value_in(service_code, quota_code, region)
    return {
        "ServiceCode": "ec2",
        "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
        "QuotaArn": "arn:aws:servicequotas:%s:%s:ec2/%s" % (region, account_id, quota_code),
        "QuotaCode": quota_code,
        "QuotaName": EC2_QUOTAS[quota_code],
        "Value": value,
        "Unit": "None",
        "Adjustable": True,
        "GlobalQuota": False,
    }


def apply():
    """Teach moto's Service Quotas backend the EC2 quotas (idempotent)."""
    from moto.servicequotas.models import ServiceQuotasBackend

    if getattr(ServiceQuotasBackend, "_dt_ec2_quotas", False):
        return
    original_get = ServiceQuotasBackend.get_service_quota
    original_list = ServiceQuotasBackend.list_aws_default_service_quotas

    def get_service_quota(self, service_code, quota_code):
        found = quota(service_code, quota_code, self.region_name, self.account_id)
        return found if found is not None else original_get(self, service_code, quota_code)

    def list_aws_default_service_quotas(self, service_code):
        if service_code == "ec2":
            return [dict(quota("ec2", code, self.region_name, self.account_id), Value=DEFAULT_VCPUS)
                    for code in sorted(EC2_QUOTAS)]
        return original_list(self, service_code)

    ServiceQuotasBackend.get_service_quota = get_service_quota
    ServiceQuotasBackend.list_aws_default_service_quotas = list_aws_default_service_quotas
    ServiceQuotasBackend._dt_ec2_quotas = True


def handle_post(body):
    """The control endpoint's POST /quota {"service": "ec2", "code": "L-...", "value": N[, "region": R]}:
    (status, reply); no region (or null): every region."""
    try:
        region = body.get("region") or None
        value = set_quota(body.get("service", "ec2"), body["code"], body["value"], region)
    except (KeyError, ValueError, TypeError) as e:
        return 400, {"error": str(e.args[0]) if e.args else str(e)}
    return 200, {"service": body.get("service", "ec2"), "code": body["code"], "value": value,
                 "name": EC2_QUOTAS[body["code"]], "region": region}
