# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""Filters of the cuda and mxnet roles; the rules live in module_utils/gpu_select.py and plugin_utils/."""

from __future__ import annotations

import glob
import os

from ansible.errors import AnsibleFilterError

from ansible_collections.dynatrain.elastic.plugins.module_utils import gpu_select
from ansible_collections.dynatrain.elastic.plugins.plugin_utils import openpgp, wheel_lock


def gpu_driver_plan(instance_type, distribution="", major_version="", machine="x86_64", branch="550",
                    architecture=None, flavour="auto", repo="", contrib=None, engine="mxnet"):
    """A node's NVIDIA driver plan (see gpu_select.driver_plan); ``engine`` raises the branch to what its CUDA build needs."""
    return gpu_select.driver_plan(instance_type, distribution, major_version, machine, branch,
                                  architecture=architecture or None, flavour=flavour, repo=repo,
                                  needs_contrib=contrib, engine=engine or "mxnet")


def gpu_instance(instance_type):
    """True when the EC2 instance type has NVIDIA GPUs."""
    return gpu_select.gpu_family(instance_type) is not None


def mxnet_requirements(gpu, version="1.9.1", gpu_package=gpu_select.MXNET_GPU_PACKAGE, runtime_wheels=None):
    """The MXNet requirement strings of a CPU (false) or GPU (true) node."""
    wheels = gpu_select.CUDA_RUNTIME_WHEELS if runtime_wheels is None else runtime_wheels
    return gpu_select.mxnet_requirements(bool(gpu), version, gpu_package, wheels)


def torch_requirements(gpu, version=gpu_select.TORCH_VERSION, cpu_local=gpu_select.TORCH_CPU_LOCAL):
    """The PyTorch requirement strings of a CPU (false) or GPU (true) node."""
    return gpu_select.torch_requirements(bool(gpu), str(version), str(cpu_local or ""))


def wheel_lock_lines(wheel_dir, roots, python_version, machine="x86_64", hashes=True):
    """Hash-pinned requirement lines for ``roots`` from the controller directory ``wheel_dir``.

    Returns dict(lines, pins, missing); see plugin_utils/wheel_lock.py. ``hashes=false``: no wheel is
    read whole, the lines carry no hashes (what is missing is the same).
    """
    if not os.path.isdir(str(wheel_dir)):
        raise AnsibleFilterError(f"wheelhouse {wheel_dir} is not a directory on the controller")
    wheels = sorted(glob.glob(os.path.join(str(wheel_dir), "*.whl")))
    try:
        return wheel_lock.lock(wheels, list(roots), str(python_version), machine,
                               hasher=wheel_lock.sha256 if hashes else None)
    except Exception as exc:  # a malformed requirement or wheel: say which, as a filter error
        raise AnsibleFilterError(f"wheel_lock_lines: {exc}") from exc


def wheels_named(files, requirements):
    """The wheel file names (of ``files``) whose project is named in ``requirements`` (``name==v`` or names)."""
    names = {wheel_lock.normalize(str(r).split("==", maxsplit=1)[0].split(";")[0].strip()) for r in requirements or []}
    return [f for f in files or [] if (wheel_lock.parse_wheel(f) or {}).get("name") in names]


def openpgp_key_problem(armored, pinned):
    """'' when an armored key file holds exactly the pinned primary key(s), else the reason to refuse it."""
    return openpgp.key_problem(armored, pinned)


class FilterModule:
    """dynatrain.elastic GPU selection filters."""

    def filters(self):
        return {
            "gpu_driver_plan": gpu_driver_plan,
            "gpu_instance": gpu_instance,
            "mxnet_requirements": mxnet_requirements,
            "torch_requirements": torch_requirements,
            "wheel_lock_lines": wheel_lock_lines,
            "wheels_named": wheels_named,
            "openpgp_key_problem": openpgp_key_problem,
        }
