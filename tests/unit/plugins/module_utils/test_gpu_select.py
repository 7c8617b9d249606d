"""GPU selection rules: driver / kernel modules / repository per instance family and OS, MXNet wheels,
the hash-pinned wheel lock and the repository key's fingerprint pin."""
from __future__ import annotations

import base64
import hashlib
import os
import re
import zipfile

import pytest

from ansible_collections.dynatrain.elastic.plugins.filter.gpu_select import FilterModule
from ansible_collections.dynatrain.elastic.plugins.module_utils import gpu_select
from ansible_collections.dynatrain.elastic.plugins.plugin_utils import openpgp, wheel_lock

F = FilterModule().filters()
DEB12 = ("Debian", "12", "x86_64")


@pytest.mark.parametrize("itype, arch, flavour, module", [
    ("p3.2xlarge", "volta", "proprietary", "nvidia-kernel-dkms"),
    ("p3dn.24xlarge", "volta", "proprietary", "nvidia-kernel-dkms"),
    ("g3.4xlarge", "maxwell", "proprietary", "nvidia-kernel-dkms"),
    ("g3s.xlarge", "maxwell", "proprietary", "nvidia-kernel-dkms"),
    ("g4dn.xlarge", "turing", "open", "nvidia-kernel-open-dkms"),
    ("g5.xlarge", "ampere", "open", "nvidia-kernel-open-dkms"),
    ("p4d.24xlarge", "ampere", "open", "nvidia-kernel-open-dkms"),
    ("p5.48xlarge", "hopper", "open", "nvidia-kernel-open-dkms"),
    ("g6.xlarge", "ada", "open", "nvidia-kernel-open-dkms"),
    ("g6e.2xlarge", "ada", "open", "nvidia-kernel-open-dkms"),
])
def test_kernel_modules_by_family(itype, arch, flavour, module):
    plan = F["gpu_driver_plan"](itype, *DEB12, branch="550")
    assert plan["ok"], plan["problem"]
    assert (plan["architecture"], plan["flavour"]) == (arch, flavour)
    assert plan["packages"] == ["cuda-drivers-550", module]


def test_kepler_needs_470_and_proprietary():
    bad = F["gpu_driver_plan"]("p2.xlarge", *DEB12, branch="550")
    assert not bad["ok"] and "K80" in bad["problem"] and 'cuda_driver_branch: "470"' in bad["problem"]
    good = F["gpu_driver_plan"]("p2.xlarge", *DEB12, branch="470")
    assert good["ok"] and good["packages"] == ["cuda-drivers-470", "nvidia-kernel-dkms"]


def test_blackwell_needs_570():
    assert "570" in F["gpu_driver_plan"]("p6-b200.48xlarge", *DEB12, branch="550")["problem"]
    assert F["gpu_driver_plan"]("p6-b200.48xlarge", *DEB12, branch="570")["flavour"] == "open"


def test_open_modules_refused_before_turing():
    plan = F["gpu_driver_plan"]("p3.2xlarge", *DEB12, branch="550", flavour="open")
    assert not plan["ok"] and "Turing" in plan["problem"] and "proprietary" in plan["problem"]
    assert F["gpu_driver_plan"]("g5.xlarge", *DEB12, flavour="proprietary")["packages"][1] == "nvidia-kernel-dkms"


def test_unknown_type_detected_on_pci_gets_open_modules():
    plan = F["gpu_driver_plan"]("", *DEB12)
    assert plan["ok"] and plan["flavour"] == "open" and plan["gpu"] == "NVIDIA GPU"


@pytest.mark.parametrize("dist, ver, machine, url, contrib", [
    ("Debian", "12", "x86_64", "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/", True),
    ("Debian", "11.9", "x86_64", "https://developer.download.nvidia.com/compute/cuda/repos/debian11/x86_64/", True),
    ("Ubuntu", "22", "x86_64", "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/", False),
    ("Ubuntu", "24", "aarch64", "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/sbsa/", False),
])
def test_repository_by_os(dist, ver, machine, url, contrib):
    plan = F["gpu_driver_plan"]("g5.xlarge", dist, ver, machine)
    assert (plan["repo_url"], plan["contrib"]) == (url, contrib)


def test_uncovered_os_said_clearly():
    plan = F["gpu_driver_plan"]("g5.xlarge", "Amazon", "2023", "x86_64")
    assert not plan["ok"] and "Amazon 2023" in plan["problem"] and "Debian 12" in plan["problem"]
    assert "Deep Learning AMI" in plan["problem"]


def test_explicit_repository_and_contrib_win():
    plan = F["gpu_driver_plan"]("g5.xlarge", "Debian", "12", "x86_64", repo="http://127.0.0.1:1/", contrib=False)
    assert (plan["repo_url"], plan["contrib"]) == ("http://127.0.0.1:1/", False)


@pytest.mark.parametrize("itype, gpu", [("g5.xlarge", True), ("P3.2XLARGE", True), ("c5.xlarge", False),
                                        ("g4ad.xlarge", False), ("", False), (None, False), ("inf2.xlarge", False)])
def test_gpu_instance(itype, gpu):
    assert F["gpu_instance"](itype) is gpu


def test_mxnet_requirements_cpu_and_gpu():
    assert F["mxnet_requirements"](False) == ["mxnet==1.9.1"]
    gpu = F["mxnet_requirements"](True)
    assert gpu[0] == "mxnet-cu117==1.9.1" and "mxnet==1.9.1" not in gpu
    names = {r.split("==", maxsplit=1)[0] for r in gpu[1:]}
    # every CUDA library libmxnet.so of mxnet-cu117 links (readelf -d) comes from one of these
    for lib in ("cuda-runtime", "cublas", "cufft", "curand", "cusolver", "cusparse", "cuda-nvrtc", "nvtx",
                "cudnn", "nccl"):
        assert f"nvidia-{lib}-cu11" in names


# -- the hash-pinned lock -------------------------------------------------------------------
def _wheel(d, fname, requires=()):
    path = os.path.join(d, fname)
    name, version = fname.split("-")[:2]
    meta = "Metadata-Version: 2.1\nName: %s\nVersion: %s\n%s\nlong description\nRequires-Dist: ignored\n" % (
        name, version, "".join("Requires-Dist: %s\n" % r for r in requires))
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}-{version}.dist-info/METADATA", meta)
        zf.writestr(f"{name}/__init__.py", fname)
    return path


def _sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture()
def house(tmp_path):
    d = str(tmp_path)
    _wheel(d, "mxnet-1.9.1-py3-none-manylinux2014_x86_64.whl", ["numpy (<2.0.0,>1.16.0)", "requests (<3,>=2.20.0)"])
    _wheel(d, "mxnet_cu117-1.9.1-py3-none-manylinux2014_x86_64.whl", ["numpy (<2.0.0,>1.16.0)", "requests (<3,>=2.20.0)"])
    _wheel(d, "nvidia_cublas_cu11-11.10.3.66-py3-none-manylinux1_x86_64.whl", ["setuptools", "wheel"])
    _wheel(d, "nvidia_cudnn_cu11-8.5.0.96-2-py3-none-manylinux1_x86_64.whl", ["setuptools", "wheel"])
    _wheel(d, "setuptools-80.0.0-py3-none-any.whl")
    _wheel(d, "wheel-0.45.1-py3-none-any.whl")
    _wheel(d, "numpy-1.23.5-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
    _wheel(d, "numpy-1.23.5-cp310-cp310-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
    _wheel(d, "numpy-1.22.0-cp311-cp311-manylinux_2_17_x86_64.whl")
    _wheel(d, "requests-2.32.0-py3-none-any.whl",
           ["idna<4,>=2.5", "PySocks!=1.5.7 ; extra == 'socks'", "colorama ; sys_platform == 'win32'"])
    _wheel(d, "idna-3.7-py3-none-any.whl")
    return d


def test_lock_cpu_node_takes_the_cpu_closure_only(house):
    out = F["wheel_lock_lines"](house, ["mxnet==1.9.1", "numpy==1.23.5"], "3.11")
    assert out["missing"] == []
    assert out["pins"] == {"mxnet": "1.9.1", "numpy": "1.23.5", "requests": "2.32.0", "idna": "3.7"}
    numpy_line = next(line for line in out["lines"] if line.startswith("numpy=="))
    # the lock is per node Python: only the cp311 build of the release is pinned
    cp311 = os.path.join(house, "numpy-1.23.5-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
    assert numpy_line == f"numpy==1.23.5 --hash=sha256:{_sha(cp311)}"
    mx = os.path.join(house, "mxnet-1.9.1-py3-none-manylinux2014_x86_64.whl")
    assert f"mxnet==1.9.1 --hash=sha256:{_sha(mx)}" in out["lines"]


def test_a_look_without_hashes_reads_no_wheel_whole_and_finds_the_same(house, monkeypatch):
    hashed = F["wheel_lock_lines"](house, ["mxnet==1.9.1", "numpy==1.23.5", "idna==9"], "3.11")

    def no_read(path):
        raise AssertionError("read whole: " + path)
    monkeypatch.setattr(wheel_lock, "sha256", no_read)
    look = F["wheel_lock_lines"](house, ["mxnet==1.9.1", "numpy==1.23.5", "idna==9"], "3.11", hashes=False)
    assert look["missing"] == hashed["missing"] and look["missing"][0].startswith("idna==9 (wheels for Python 3.11")
    assert look["pins"] == hashed["pins"] and look["files"] == hashed["files"]
    assert look["lines"] == [line.split(" --hash=")[0] for line in hashed["lines"]]
    with pytest.raises(Exception, match="read whole"):          # the hashed lock reads them (the filter says so)
        F["wheel_lock_lines"](house, ["idna==3.7"], "3.11")


def test_lock_gpu_node_takes_cuda_build_and_its_deps(house):
    roots = ["mxnet-cu117==1.9.1", "nvidia-cublas-cu11==11.10.3.66", "nvidia-cudnn-cu11==8.5.0.96", "numpy==1.23.5"]
    out = F["wheel_lock_lines"](house, roots, "3.10")
    assert out["missing"] == []
    assert "mxnet" not in out["pins"] and out["pins"]["mxnet-cu117"] == "1.9.1"
    assert {"setuptools", "wheel", "nvidia-cudnn-cu11"} <= set(out["pins"])
    numpy_line = next(line for line in out["lines"] if line.startswith("numpy=="))
    assert numpy_line.count("--hash=sha256:") == 1        # only the cp310 build fits Python 3.10


def test_lock_says_what_is_missing(tmp_path):
    d = str(tmp_path)
    _wheel(d, "mxnet-1.9.1-py3-none-manylinux2014_x86_64.whl")
    out = F["wheel_lock_lines"](d, ["mxnet-cu117==1.9.1", "numpy==1.23.5"], "3.11")
    assert len(out["missing"]) == 2
    assert out["missing"][0].startswith("mxnet-cu117==1.9.1 (wheels for Python 3.11 x86_64 in the wheelhouse: none")


def test_lock_hash_changes_when_a_wheel_is_swapped(house):
    before = F["wheel_lock_lines"](house, ["idna==3.7"], "3.11")["lines"]
    _wheel(house, "idna-3.7-py3-none-any.whl", ["evil"])
    after = F["wheel_lock_lines"](house, ["idna==3.7"], "3.11")
    assert after["lines"] != before and after["missing"] == ["evil (wheels for Python 3.11 x86_64 in the wheelhouse: none)"]


@pytest.mark.parametrize("fname, py, fits", [
    ("numpy-1.23.5-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "3.11", True),
    ("numpy-1.23.5-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "3.10", False),
    ("scipy-1.15.3-cp311-cp311-manylinux_2_17_aarch64.whl", "3.11", False),
    ("cryptography-43.0.0-cp39-abi3-manylinux_2_28_x86_64.whl", "3.11", True),
    ("cryptography-43.0.0-cp39-abi3-manylinux_2_28_x86_64.whl", "3.8", False),
    ("six-1.16.0-py2.py3-none-any.whl", "3.10", True),
    ("not-a-wheel.txt", "3.11", False),
])
def test_wheel_fits(fname, py, fits):
    assert wheel_lock.wheel_fits(fname, py) is fits


# -- the repository key's fingerprint -----------------------------------------------------------
def _armor(data, headers=True):
    b64 = base64.b64encode(data).decode()
    body = "\n".join(b64[i:i + 64] for i in range(0, len(b64), 64))
    head = "Comment: test\n\n" if headers else "\n"
    return f"-----BEGIN PGP PUBLIC KEY BLOCK-----\n{head}{body}\n=abcd\n-----END PGP PUBLIC KEY BLOCK-----\n"


def _key_packet(seed, tag=6, old=True):
    body = bytes([4]) + seed.to_bytes(4, "big") + bytes([22, 0, 8]) + bytes(range(8))   # v4, time, algo, a field
    hdr = bytes([0x80 | (tag << 2) | 0, len(body)]) if old else bytes([0xC0 | tag, len(body)])
    return hdr + body, hashlib.sha1(b"\x99" + len(body).to_bytes(2, "big") + body).hexdigest().upper()


def test_fingerprint_of_primary_keys_only():
    key, fpr = _key_packet(1)
    sub, sub_fpr = _key_packet(2, tag=14, old=False)
    uid = bytes([0xCD, 4]) + b"test"          # new-format user id packet
    armored = _armor(key + uid + sub)
    assert openpgp.primary_fingerprints(armored) == [fpr]
    assert F["openpgp_key_problem"](armored, fpr) == ""
    assert F["openpgp_key_problem"](armored, " ".join(fpr[i:i + 4] for i in range(0, 40, 4)).lower()) == ""
    problem = F["openpgp_key_problem"](armored, sub_fpr)
    assert "refusing" in problem and fpr in problem


def test_key_with_an_extra_primary_key_is_refused():
    key1, fpr1 = _key_packet(1)
    key2, _fpr2 = _key_packet(3, old=False)
    assert "refusing" in F["openpgp_key_problem"](_armor(key1 + key2, headers=False), fpr1)


@pytest.mark.parametrize("text, needle", [("<html>not found</html>", "not a usable OpenPGP"),
                                          (_armor(b"\x01\x02"), "not a usable OpenPGP")])
def test_garbage_key_refused(text, needle):
    assert needle in F["openpgp_key_problem"](text, "EB693B3035CD5710E231E123A4B469963BF863CC")


def test_nothing_pinned_refused():
    key, _fpr = _key_packet(1)
    assert "no fingerprint is pinned" in F["openpgp_key_problem"](_armor(key), "")


def test_families_known_to_the_cuda_role_defaults_are_classified():
    import yaml
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
    with open(os.path.join(root, "roles", "cuda", "defaults", "main.yml")) as fh:
        fams = yaml.safe_load(fh)["cuda_gpu_instance_families"]
    assert sorted(fams) == sorted(gpu_select.GPU_FAMILIES)


def test_gpu_wheel_pins_agree_everywhere():
    """requirements-node-gpu.txt (the wheelhouse), the mxnet role's defaults and gpu_select pin the same wheels."""
    import yaml
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
    with open(os.path.join(root, "requirements-node-gpu.txt")) as fh:
        req = [line.split("#")[0].strip() for line in fh if line.split("#")[0].strip()]
    with open(os.path.join(root, "roles", "mxnet", "defaults", "main.yml")) as fh:
        defaults = yaml.safe_load(fh)
    assert req[0] == f"{defaults['mxnet_gpu_package']}=={defaults['mxnet_version']}" == "mxnet-cu117==1.9.1"
    assert req[1:] == defaults["mxnet_cuda_runtime_wheels"] == list(gpu_select.CUDA_RUNTIME_WHEELS)
    assert defaults["mxnet_gpu_package"] == gpu_select.MXNET_GPU_PACKAGE


def test_wheels_named_picks_the_gpu_only_wheels():
    files = ["mxnet-1.9.1-py3-none-manylinux2014_x86_64.whl", "mxnet_cu117-1.9.1-py3-none-manylinux2014_x86_64.whl",
             "nvidia_cudnn_cu11-8.5.0.96-2-py3-none-manylinux1_x86_64.whl", "dynatrain_runtime-0.1.0+gabc-py3-none-any.whl",
             "README.txt"]
    gpu_only = F["wheels_named"](files, ["mxnet-cu117", "nvidia-cudnn-cu11==8.5.0.96"])
    assert gpu_only == files[1:3]


# -- the torch engine (dt_engine=torch): its wheels, its lock, its driver branch ------------------
def test_torch_requirements_pin_the_build_exactly():
    assert F["torch_requirements"](False) == ["torch==2.13.0+cpu"]
    # PyPI's CUDA build, exactly: ==2.13.0 would also match 2.13.0+cpu, which sorts after it
    assert F["torch_requirements"](True) == ["torch===2.13.0"]
    assert F["torch_requirements"](False, "2.13.0", "") == ["torch==2.13.0"]


@pytest.fixture()
def torch_house(tmp_path):
    d = str(tmp_path)
    _wheel(d, "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", ["filelock", "typing-extensions>=4.10.0"])
    _wheel(d, "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl", [
        "filelock", "typing-extensions>=4.10.0",
        'cuda-toolkit[cublas,cudart]==13.0.3; platform_system == "Linux"',
        'nvidia-nccl-cu13==2.29.7; platform_system == "Linux"',
        'triton==3.7.1; platform_system == "Linux" and python_version < "3.15"',
        'optree>=0.13.0; extra == "optree"'])
    _wheel(d, "cuda_toolkit-13.0.3.0-py2.py3-none-any.whl", [
        'nvidia-cublas==13.1.1.3; extra == "cublas"', 'nvidia-cuda-runtime==13.0.96; extra == "cudart"',
        'nvidia-cufft==12.0.0.61; extra == "cufft"'])
    _wheel(d, "nvidia_cublas-13.1.1.3-py3-none-manylinux_2_27_x86_64.whl")
    _wheel(d, "nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl")
    _wheel(d, "nvidia_nccl_cu13-2.29.7-py3-none-manylinux_2_18_x86_64.whl")
    _wheel(d, "triton-3.7.1-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl")
    _wheel(d, "filelock-4.3.1-py3-none-any.whl")
    _wheel(d, "typing_extensions-4.16.0-py3-none-any.whl")
    _wheel(d, "numpy-1.23.5-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
    return d


def test_lock_torch_cpu_node_takes_the_cpu_build_only(torch_house):
    out = F["wheel_lock_lines"](torch_house, F["torch_requirements"](False) + ["numpy==1.23.5"], "3.11")
    assert out["missing"] == []
    assert out["pins"] == {"torch": "2.13.0+cpu", "filelock": "4.3.1", "typing-extensions": "4.16.0", "numpy": "1.23.5"}
    cpu = os.path.join(torch_house, "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
    assert f"torch==2.13.0+cpu --hash=sha256:{_sha(cpu)}" in out["lines"]
    assert not any(f.startswith(("nvidia", "triton", "cuda")) for f in out["files"])


def test_lock_torch_gpu_node_takes_pypis_cuda_build_and_its_libraries(torch_house):
    out = F["wheel_lock_lines"](torch_house, F["torch_requirements"](True), "3.11")
    assert out["missing"] == []
    assert out["pins"]["torch"] == "2.13.0"
    # cuda-toolkit's extras resolved to the CUDA 13 libraries torch names; its other extras (cufft) not
    assert {"cuda-toolkit", "nvidia-cublas", "nvidia-cuda-runtime", "nvidia-nccl-cu13", "triton"} <= set(out["pins"])
    assert "nvidia-cufft" not in out["pins"] and "optree" not in out["pins"]
    gpu = os.path.join(torch_house, "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl")
    assert f"torch==2.13.0 --hash=sha256:{_sha(gpu)}" in out["lines"]


def test_lock_torch_gpu_node_without_the_cuda_build_says_so(tmp_path):
    d = str(tmp_path)
    _wheel(d, "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
    out = F["wheel_lock_lines"](d, F["torch_requirements"](True), "3.11")
    assert out["missing"] == ["torch===2.13.0 (wheels for Python 3.11 x86_64 in the wheelhouse: 2.13.0+cpu)"]


def test_driver_branch_follows_the_engine():
    plan = F["gpu_driver_plan"]("p5.48xlarge", *DEB12, branch="550", engine="torch")
    assert plan["ok"] and plan["branch"] == "580" and plan["packages"][0] == "cuda-drivers-580"
    assert F["gpu_driver_plan"]("g5.xlarge", *DEB12, branch="590", engine="torch")["branch"] == "590"
    mxnet = F["gpu_driver_plan"]("g5.xlarge", *DEB12, branch="550")
    assert mxnet["branch"] == "550" and mxnet["packages"][0] == "cuda-drivers-550"
    # K80 (p2): NVIDIA's last branch for it is 470, PyTorch's CUDA 13 build needs 580
    bad = F["gpu_driver_plan"]("p2.xlarge", *DEB12, branch="470", engine="torch")
    assert not bad["ok"] and "needs driver branch 580" in bad["problem"] and "dt_engine=mxnet" in bad["problem"]
    assert F["gpu_driver_plan"]("p2.xlarge", *DEB12, branch="470")["ok"]


def test_torch_pins_agree_everywhere():
    """requirements-node-torch*.txt (the wheelhouse), the torch role's defaults and gpu_select pin the same torch."""
    import yaml
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

    def pins(name):
        with open(os.path.join(root, name)) as fh:
            return [line.split("#")[0].strip() for line in fh if line.split("#")[0].strip()]

    with open(os.path.join(root, "roles", "torch", "defaults", "main.yml")) as fh:
        defaults = yaml.safe_load(fh)
    cpu = F["torch_requirements"](False, defaults["torch_version"], defaults["torch_cpu_local_version"])
    gpu = F["torch_requirements"](True, defaults["torch_version"])
    assert pins("requirements-node-torch.txt")[0] == cpu[0] == "torch==%s+cpu" % gpu_select.TORCH_VERSION
    assert pins("requirements-node-torch-gpu.txt")[0] == gpu[0] == "torch===%s" % gpu_select.TORCH_VERSION
    # every line pinned exactly: an unpinned torch (or one of its libraries) pulls the newest CUDA build
    assert all(re.match(r"^[A-Za-z0-9_.-]+===?[0-9][^\s;]*$", p) for p in
               pins("requirements-node-torch.txt") + pins("requirements-node-torch-gpu.txt"))
    # the numpy/scikit-learn/boto3 the torch nodes get are the MXNet nodes' (one wheelhouse for both)
    node = pins("requirements-node.txt")
    assert defaults["torch_numpy_spec"] in node
    assert set(defaults["torch_extra_packages"]) <= set(node + pins("requirements-node-torch.txt"))


def test_the_seeding_keeps_the_runtime_wheel_and_leaves_the_other_engine():
    files = ["dynatrain_runtime-0.1.0+gabc-py3-none-any.whl", "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
             "mxnet-1.9.1-py3-none-manylinux2014_x86_64.whl"]
    # the mxnet and torch roles seed the locked wheels and these (their _<role>_seed_always)
    assert F["wheels_named"](files, ["dynatrain-runtime"]) == files[:1]
