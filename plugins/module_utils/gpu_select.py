# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""Which GPU software a node gets: one home for the rules of the cuda and mxnet roles.

Pure Python (no Ansible, no network), so every rule is unit-tested
(tests/unit/plugins/module_utils/test_gpu_select.py); the roles reach it through the
filters of plugins/filter/gpu_select.py.

* ``gpu_family(instance_type)``: the NVIDIA GPU of an EC2 instance family
  (architecture, model), or None for a CPU (or non-NVIDIA) family.
* ``driver_plan(instance_type, os facts, ...)``: NVIDIA's apt repository for
  the node's OS, the kernel-module flavour (proprietary before Turing, open
  from Turing on) and the packages, or the reason the node cannot have one.
* ``mxnet_requirements(gpu, version)``: the pip requirements of the MXNet
  build the node gets (CPU wheel, or the CUDA 11.7 build plus the CUDA runtime
  libraries it links, from NVIDIA's ``nvidia-*-cu11`` wheels).
* ``torch_requirements(gpu, version)``: the pip requirement of the PyTorch
  build the node gets (PyTorch's CPU build ``torch==V+cpu``, or PyPI's CUDA 13
  build ``torch===V``, whose ``nvidia-*`` libraries follow from its metadata).
* ``ENGINE_MIN_BRANCH``: the driver branch an engine's CUDA build needs
  (``driver_plan(..., engine=)`` raises the branch to it).
"""

from __future__ import annotations

import re

# family -> (architecture, GPU). Architectures before Turing need NVIDIA's
# proprietary kernel modules; Turing and newer run the open ones (NVIDIA's
# default from driver 560 on; Blackwell supports only the open ones).
GPU_FAMILIES = {
    "p2": ("kepler", "K80"),
    "g3": ("maxwell", "M60"),
    "g3s": ("maxwell", "M60"),
    "p3": ("volta", "V100"),
    "p3dn": ("volta", "V100"),
    "g4dn": ("turing", "T4"),
    "g5": ("ampere", "A10G"),
    "g5g": ("turing", "T4G"),
    "p4d": ("ampere", "A100"),
    "p4de": ("ampere", "A100"),
    "g6": ("ada", "L4"),
    "gr6": ("ada", "L4"),
    "g6e": ("ada", "L40S"),
    "g6f": ("ada", "L4"),
    "p5": ("hopper", "H100"),
    "p5e": ("hopper", "H200"),
    "p5en": ("hopper", "H200"),
    "p6-b200": ("blackwell", "B200"),
}
PRE_TURING = ("kepler", "maxwell", "pascal", "volta")
# Kepler's last driver branch; Blackwell's first.
MAX_BRANCH = {"kepler": 470}
MIN_BRANCH = {"blackwell": 570}

# NVIDIA's repository directory per OS (ansible_facts distribution + major
# version) and per architecture (arm64 servers are "sbsa").
REPO_BASE = "https://developer.download.nvidia.com/compute/cuda/repos/"
REPO_OS = {
    ("debian", "11"): "debian11",
    ("debian", "12"): "debian12",
    ("ubuntu", "20"): "ubuntu2004",
    ("ubuntu", "22"): "ubuntu2204",
    ("ubuntu", "24"): "ubuntu2404",
}
REPO_ARCH = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "sbsa", "arm64": "sbsa"}
KERNEL_MODULES = {"open": "nvidia-kernel-open-dkms", "proprietary": "nvidia-kernel-dkms"}

# The newest CUDA build of MXNet 1.9.1 on PyPI (none exists for CUDA 12). Its
# libmxnet.so bundles only OpenBLAS/gfortran and links (readelf -d):
# libcudart.so.11.0 libcublas.so.11 libcufft.so.10 libcurand.so.10
# libcusolver.so.11 libcusparse.so.11 libnvrtc.so.11.2 libnvToolsExt.so.1
# libcudnn.so.8 libnccl.so.2 (+ libcuda.so.1 from the driver). These wheels
# carry them (the CUDA 11.7 set PyTorch 2.0 shipped with; cuDNN 8 / NCCL 2 keep
# their sonames across minor versions).
MXNET_GPU_PACKAGE = "mxnet-cu117"
CUDA_RUNTIME_WHEELS = (
    "nvidia-cuda-runtime-cu11==11.7.99",
    "nvidia-cublas-cu11==11.10.3.66",
    "nvidia-cufft-cu11==10.9.0.58",
    "nvidia-curand-cu11==10.2.10.91",
    "nvidia-cusolver-cu11==11.4.0.1",
    "nvidia-cusparse-cu11==11.7.4.91",
    "nvidia-cuda-nvrtc-cu11==11.7.99",
    "nvidia-nvtx-cu11==11.7.91",
    "nvidia-cudnn-cu11==8.5.0.96",
    "nvidia-nccl-cu11==2.14.3",
)


# mxnet-cu117 1.9.1 carries SASS for sm_50/60/70/80/86 and no PTX (config/distribution/linux_cu117.cmake).
# SASS of sm_X.y runs on sm_X.z with z >= y: Maxwell (sm_52), Pascal, Volta, Turing (sm_75), Ampere and
# Ada (sm_89 runs sm_86 code) have kernels; Hopper (sm_90, p5*) and Blackwell (sm_100, p6*) have none.
MXNET_GPU_ARCHITECTURES = ("maxwell", "pascal", "volta", "turing", "ampere", "ada")
# P families from this generation on carry GPUs newer than the MXNet build (p5: H100), also
# those not yet in GPU_FAMILIES (p6e-gb200, p6-b300, ...).
NEWER_THAN_MXNET_P_GENERATION = 5


def instance_family(instance_type):
    """``g5.xlarge`` -> ``g5``; '' for an empty or missing type."""
    return str(instance_type or "").strip().lower().split(".", maxsplit=1)[0]


def gpu_family(instance_type):
    """(architecture, GPU model) of an instance type's NVIDIA GPU, or None (CPU / unknown / not NVIDIA)."""
    return GPU_FAMILIES.get(instance_family(instance_type))


def mxnet_gpu_kernels(instance_type):
    """False when MXNet 1.9.1's CUDA build has no kernels for the instance type's GPUs (p5/H100 and
    newer, p2/K80); True for the GPUs it runs on and for CPU types (the CPU wheel)."""
    family = gpu_family(instance_type)
    if family is not None:
        return family[0] in MXNET_GPU_ARCHITECTURES
    match = re.match(r"^p([0-9]+)", instance_family(instance_type))
    return not (match and int(match.group(1)) >= NEWER_THAN_MXNET_P_GENERATION)


def kernel_module_flavour(architecture):
    """``proprietary`` before Turing (NVIDIA's open modules need Turing or newer), else ``open``."""
    return "proprietary" if architecture in PRE_TURING else "open"


def repo_url(distribution, major_version, machine, base=REPO_BASE):
    """NVIDIA's flat apt repository for the OS, or raise ValueError saying which OS is not covered."""
    key = (str(distribution or "").lower(), str(major_version or "").split(".", maxsplit=1)[0])
    name = REPO_OS.get(key)
    arch = REPO_ARCH.get(str(machine or "").lower())
    if name is None:
        covered = ", ".join(f"{d.title()} {v}" for d, v in sorted(REPO_OS))
        raise ValueError(f"NVIDIA has no apt repository for {distribution} {major_version} (covered: {covered});"
                         " use a Deep Learning AMI (driver preinstalled) or set cuda_repo_url")
    if arch is None:
        raise ValueError(f"NVIDIA has no apt repository for machine {machine!r} (x86_64 or aarch64 only)")
    return f"{base}{name}/{arch}/"


def driver_plan(instance_type, distribution, major_version, machine, branch, architecture=None,
                flavour="auto", repo="", needs_contrib=None, engine="mxnet"):
    """What the cuda role installs on one GPU node.

    ``architecture`` overrides the one of the instance family (PCI-detected GPUs of an
    unknown type: ``None`` then means "Turing or newer", the open modules);
    ``flavour`` ``auto``/``open``/``proprietary``; ``repo`` a repository URL or ''
    for NVIDIA's of this OS. Returns a dict: ``ok``, ``problem`` (why not, what to
    change), ``architecture``, ``gpu``, ``flavour``, ``repo_url``, ``contrib``
    (Debian needs its ``contrib`` component for the driver's dependencies),
    ``packages``, ``branch`` (the branch installed: ``branch``, raised to the
    engine's ``ENGINE_MIN_BRANCH``).
    """
    fam = gpu_family(instance_type)
    arch = architecture or (fam[0] if fam else None)
    gpu = fam[1] if fam else "NVIDIA GPU"
    plan = {"ok": False, "problem": "", "architecture": arch or "unknown", "gpu": gpu, "flavour": "",
            "repo_url": repo, "contrib": False, "packages": [], "branch": str(branch)}
    try:
        branch_n = int(str(branch))
    except ValueError:
        plan["problem"] = f"cuda_driver_branch must be a number like 550 (got {branch!r})"
        return plan
    need = ENGINE_MIN_BRANCH.get(str(engine or "mxnet"), 0)
    branch_n = max(branch_n, need)
    plan["branch"] = str(branch_n)
    if arch in MAX_BRANCH and need > MAX_BRANCH[arch]:
        plan["problem"] = (f"{instance_type} has {gpu} ({arch}) GPUs, which NVIDIA supports only up to driver branch"
                           f" {MAX_BRANCH[arch]}, but dt_engine={engine} needs driver branch {need} or newer (its"
                           " CUDA 13 build): use dt_engine=mxnet on these nodes, or an instance type with newer GPUs")
        return plan
    if arch in MAX_BRANCH and branch_n > MAX_BRANCH[arch]:
        plan["problem"] = (f"{instance_type} has {gpu} ({arch}) GPUs, which NVIDIA supports only up to driver branch"
                           f" {MAX_BRANCH[arch]}; set cuda_driver_branch: \"{MAX_BRANCH[arch]}\" for these nodes"
                           " (or use another instance type)")
        return plan
    if arch in MIN_BRANCH and branch_n < MIN_BRANCH[arch]:
        plan["problem"] = (f"{instance_type} has {gpu} ({arch}) GPUs, which need driver branch {MIN_BRANCH[arch]}"
                           f" or newer; set cuda_driver_branch: \"{MIN_BRANCH[arch]}\" or newer")
        return plan
    if flavour == "auto":
        flavour = kernel_module_flavour(arch)
    if flavour not in KERNEL_MODULES:
        plan["problem"] = f"cuda_kernel_modules must be auto, open or proprietary (got {flavour!r})"
        return plan
    if flavour == "open" and arch in PRE_TURING:
        plan["problem"] = (f"{instance_type} has {gpu} ({arch}) GPUs: NVIDIA's open kernel modules need Turing or"
                           " newer; set cuda_kernel_modules: proprietary (or auto)")
        return plan
    if not repo:
        try:
            repo = repo_url(distribution, major_version, machine)
        except ValueError as exc:
            plan["problem"] = str(exc)
            return plan
    plan.update(ok=True, flavour=flavour, repo_url=repo,
                contrib=str(distribution or "").lower() == "debian" if needs_contrib is None else bool(needs_contrib),
                packages=[f"cuda-drivers-{branch_n}", KERNEL_MODULES[flavour]])
    return plan


def mxnet_requirements(gpu, version="1.9.1", gpu_package=MXNET_GPU_PACKAGE, runtime_wheels=CUDA_RUNTIME_WHEELS):
    """The MXNet requirements of a node: ``mxnet==V`` on CPU nodes; the CUDA build + its runtime wheels on GPU nodes."""
    if not gpu:
        return [f"mxnet=={version}"]
    return [f"{gpu_package}=={version}"] + list(runtime_wheels)


# -- PyTorch (dt_engine=torch) -------------------------------------------------
# The PyTorch release the nodes get. CPU nodes: PyTorch's CPU build (local version
# label +cpu, from download.pytorch.org/whl/cpu or a wheelhouse; 192 MB). GPU nodes:
# PyPI's build of the same release, which is CUDA 13 (its nvidia-* libraries, triton and
# cuda-toolkit are pinned in its own metadata; several GB). An unpinned `torch` would be
# the newest CUDA build: always pinned exactly.
TORCH_VERSION = "2.13.0"
TORCH_CPU_LOCAL = "cpu"
# The NVIDIA driver branch an engine's CUDA build needs: torch 2.13's CUDA 13 runtime
# needs the 580 branch; mxnet-cu117 (CUDA 11.7) runs on the cuda role's default.
ENGINE_MIN_BRANCH = {"torch": 580}


def torch_requirements(gpu, version=TORCH_VERSION, cpu_local=TORCH_CPU_LOCAL):
    """The PyTorch requirement of a node: ``torch==V+cpu`` on CPU nodes; ``torch===V`` (PyPI's CUDA build,
    exactly: ``==V`` would also match the CPU build, whose local label sorts after it) on GPU nodes."""
    if gpu:
        return [f"torch==={version}"]
    return [f"torch=={version}+{cpu_local}" if cpu_local else f"torch=={version}"]
