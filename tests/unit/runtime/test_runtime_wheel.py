"""The node runtime wheel: what runtime/build.py puts in it, and that it matches the collection."""
import os
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BUILD = os.path.join(ROOT, "runtime", "build.py")
FORMAT = os.path.join(ROOT, "plugins", "module_utils", "shared_volume.py")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheelhouse")
    stale = out / "dynatrain_runtime-0.0.1+gold-py3-none-any.whl"
    stale.write_bytes(b"old build")
    path = subprocess.run([sys.executable, BUILD, "--out", str(out)], check=True, text=True,
                          stdout=subprocess.PIPE).stdout.strip().splitlines()[-1]
    return path, out


def test_the_format_module_is_the_collections_byte_for_byte(wheel):
    with zipfile.ZipFile(wheel[0]) as zf:
        shipped = zf.read("dynatrain_runtime/contract/shared_volume.py")
    with open(FORMAT, "rb") as handle:
        assert shipped == handle.read()


def test_version_carries_a_digest_of_the_sources_and_old_wheels_go(wheel):
    version = subprocess.run([sys.executable, BUILD, "--out", "unused", "--print-version"], check=True,
                             text=True, stdout=subprocess.PIPE).stdout.strip()
    assert os.path.basename(wheel[0]) == f"dynatrain_runtime-{version}-py3-none-any.whl"
    assert version.split("+g")[1] and len(version.split("+g")[1]) == 10
    assert sorted(os.listdir(wheel[1])) == [os.path.basename(wheel[0])]


def test_wheel_has_the_package_and_the_commands(wheel):
    with zipfile.ZipFile(wheel[0]) as zf:
        names = zf.namelist()
        entry_points = next(zf.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    for module in ("__init__", "_version", "script/elastic", "script/data", "script/recovery", "engines/devices",
                   "engines/snapshot", "contract/checkpoint", "contract/shared_volume", "contract/protocol",
                   "engines/mxnet_serve", "launcher/loop", "launcher/cli", "examples/train_digits",
                   "examples/digits_common", "examples/mxnet_digits", "examples/prepare_digits",
                   "daemons/s3sync", "daemons/spot"):
        assert f"dynatrain_runtime/{module}.py" in names, module
    assert not any("build.py" in n or "__pycache__" in n for n in names)
    for command in ("dt-launcher = dynatrain_runtime.launcher:main",
                    "dt-train-digits = dynatrain_runtime.examples.train_digits:main",
                    "dt-prepare-digits = dynatrain_runtime.examples.prepare_digits:main",
                    "dt-spot-watch = dynatrain_runtime.daemons.spot:main",
                    "dt-checkpoint-sync = dynatrain_runtime.daemons.s3sync:sync_main",
                    "dt-checkpoint-restore = dynatrain_runtime.daemons.s3sync:restore_main"):
        assert command in entry_points
    with zipfile.ZipFile(wheel[0]) as zf:
        metadata = next(zf.read(n).decode() for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert requires and all("extra ==" in line for line in requires)     # no dependency outside the extras
    assert any(line.startswith("Requires-Dist: boto3") and "extra == \"s3\"" in line for line in requires)


def test_the_installed_runtime_is_this_checkouts():
    """The controller venv's copy (make runtime) must not lag behind the sources."""
    import dynatrain_runtime
    version = subprocess.run([sys.executable, BUILD, "--out", "unused", "--print-version"], check=True,
                             text=True, stdout=subprocess.PIPE).stdout.strip()
    assert dynatrain_runtime.__version__ == version, "run `make runtime` after editing runtime/"
