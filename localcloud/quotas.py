"""Service Quotas for EC2 on the local cloud, answered like AWS (issue 12).

moto's Service Quotas knows only `vpc`; preflight reads the EC2 vCPU quotas
(`GetServiceQuota` with service code `ec2`), so this module answers the Running
On-Demand and Spot vCPU quotas of each instance family class with AWS's quota codes
and names, at values a test can set: `python -m localcloud quota ec2 L-1216C47A 32`
(the daemon's control endpoint, POST /quota), or `set_quota` in-process.
"""
from __future__ import annotations

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
_values: dict[tuple[str, str], float] = {}


def set_quota(service_code, quota_code, value):
    """Set one quota's value (vCPUs); returns it. Unknown codes are refused like AWS's NoSuchResource."""
    if service_code != "ec2" or quota_code not in EC2_QUOTAS:
        raise KeyError("no quota %s/%s (known: ec2 %s)" % (service_code, quota_code, ", ".join(sorted(EC2_QUOTAS))))
    value = float(value)
    if value < 0:
        raise ValueError("a quota is not negative: %s" % value)
    with _lock:
        _values[(service_code, quota_code)] = value
    return value


def reset():
    with _lock:
        _values.clear()


def quota(service_code, quota_code, region, account_id):
    """The quota as GetServiceQuota returns it, or None when it is not an EC2 quota we answer."""
    if service_code != "ec2" or quota_code not in EC2_QUOTAS:
        return None
    with _lock:
        value = _values.get((service_code, quota_code), DEFAULT_VCPUS)
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
    """The control endpoint's POST /quota {"service": "ec2", "code": "L-...", "value": N}: (status, reply)."""
    try:
        value = set_quota(body.get("service", "ec2"), body["code"], body["value"])
    except (KeyError, ValueError, TypeError) as e:
        return 400, {"error": str(e.args[0]) if e.args else str(e)}
    return 200, {"service": body.get("service", "ec2"), "code": body["code"], "value": value,
                 "name": EC2_QUOTAS[body["code"]]}
