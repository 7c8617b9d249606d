"""Build the node runtime wheel: ``python runtime/build.py --out DIR``.

The wheel is built from a temporary copy of ``runtime/`` to which two files are added:
``contract/shared_volume.py`` -- the collection's ``plugins/module_utils/shared_volume.py``,
the shared volume's one contract, copied unchanged -- and ``_version.py``:
the collection version plus a digest of the sources (``0.1.0+g1a2b3c4d5e``), so a node
reinstalls exactly when the code changed.  Older ``dynatrain_runtime-*.whl`` in DIR
are removed.  Needs setuptools >= 77 in the running Python (no network).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FORMAT_SRC = os.path.join(ROOT, "plugins", "module_utils", "shared_volume.py")
PACKAGE = "dynatrain_runtime"


def collection_version():
    with open(os.path.join(ROOT, "galaxy.yml")) as handle:
        match = re.search(r"^version:\s*['\"]?([0-9][^'\"\s]*)", handle.read(), re.M)
    if not match:
        raise SystemExit("runtime/build.py: no version in galaxy.yml")
    return match.group(1)


def sources():
    """The files that make the wheel, in a stable order."""
    files = sorted(glob.glob(os.path.join(HERE, PACKAGE, "**", "*.py"), recursive=True))
    return files + [os.path.join(HERE, "pyproject.toml"), FORMAT_SRC]


def version():
    digest = hashlib.sha256()
    for path in sources():
        digest.update(os.path.relpath(path, ROOT).encode() + b"\0")
        with open(path, "rb") as handle:
            digest.update(handle.read())
    return f"{collection_version()}+g{digest.hexdigest()[:10]}"


def stage(tmp, ver):
    """A copy of runtime/ with the generated files, ready for the build backend."""
    src = os.path.join(tmp, "src")
    shutil.copytree(HERE, src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info", "build.py"))
    pkg = os.path.join(src, PACKAGE)
    with open(FORMAT_SRC) as handle:
        fmt = handle.read()
    with open(os.path.join(pkg, "contract", "shared_volume.py"), "w") as handle:
        handle.write(fmt)   # byte-identical: the launcher role verifies it
    with open(os.path.join(pkg, "_version.py"), "w") as handle:
        handle.write(f'__version__ = "{ver}"\n')
    return src


def build(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    ver = version()
    wheel_name = f"{PACKAGE}-{ver}-py3-none-any.whl"
    target = os.path.join(out_dir, wheel_name)
    if not os.path.exists(target):
        with tempfile.TemporaryDirectory(prefix="dt-runtime-") as tmp:
            src = stage(tmp, ver)
            subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "--no-index", "-w", os.path.join(tmp, "dist"), src], check=True)
            built = glob.glob(os.path.join(tmp, "dist", f"{PACKAGE}-*.whl"))
            if len(built) != 1:
                raise SystemExit(f"runtime/build.py: expected one wheel, got {built}")
            shutil.move(built[0], target)
    for old in glob.glob(os.path.join(out_dir, f"{PACKAGE}-*.whl")):
        if os.path.basename(old) != wheel_name:
            os.unlink(old)
    return target


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--out", required=True, help="directory for the wheel (e.g. the wheelhouse)")
    ap.add_argument("--print-version", action="store_true", help="print the version the wheel would have")
    args = ap.parse_args(argv)
    if args.print_version:
        print(version())
        return 0
    print(build(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
