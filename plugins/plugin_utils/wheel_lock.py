# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""A hash-pinned requirements file for one node, computed on the controller from its wheelhouse.

The nodes install from a wheelhouse on the shared volume, which every node can
write as root. The controller therefore computes the sha256 of each wheel it
seeds there and the mxnet role installs with ``pip --require-hashes``: a wheel
swapped on the shared volume by one node no longer installs on the others.

``lock(wheels, roots, python_version)`` resolves ``roots`` (requirement
strings) against the wheels that fit the node's Python, following each wheel's
``Requires-Dist`` (markers evaluated for a Linux CPython of that version), and
returns the pinned closure with the hashes of every fitting file of each
pinned version (a wheelhouse may hold a cp310 and a cp311 build of one
release). Controller-side only (needs ``packaging``, which ansible-core has).
"""

from __future__ import annotations

import hashlib
import os
import re
import zipfile

_WHEEL_RE = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-(?P<build>\d[^-]*))?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$")


def normalize(name):
    """PEP 503 name normalisation: ``Scikit_Learn`` -> ``scikit-learn``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_wheel(filename):
    """``numpy-1.23.5-cp311-cp311-manylinux_2_17_x86_64.whl`` -> dict(name, version, py, abi, plat) or None."""
    m = _WHEEL_RE.match(os.path.basename(filename))
    if not m:
        return None
    return {"name": normalize(m.group("name")), "version": m.group("version"),
            "py": m.group("py").split("."), "abi": m.group("abi").split("."), "plat": m.group("plat").split(".")}


def wheel_fits(filename, python_version, machine="x86_64"):
    """True when a wheel installs on CPython ``python_version`` (``3.11``) on Linux ``machine``."""
    w = parse_wheel(filename)
    if w is None:
        return False
    major, minor = (int(x) for x in str(python_version).split(".")[:2])
    own = {f"cp{major}{minor}", f"py{major}{minor}", f"py{major}"}
    py_ok = bool(own & set(w["py"]))
    if not py_ok and "abi3" in w["abi"]:   # cp38-abi3 fits every CPython 3.8+
        py_ok = any(t.startswith(f"cp{major}") and int(t[len(f"cp{major}"):] or 0) <= minor for t in w["py"])
    plat_ok = any(p == "any" or (p.startswith(("manylinux", "linux")) and p.endswith("_" + machine))
                  for p in w["plat"])
    return py_ok and plat_ok


def requires_dist(path):
    """The ``Requires-Dist`` lines of a wheel's METADATA (read from the zip's directory, not the whole file)."""
    with zipfile.ZipFile(path) as zf:
        meta = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if not meta:
            return []
        text = zf.read(meta[0]).decode("utf-8", "replace")
    head = text.split("\n\n", 1)[0]      # the headers; the body is the long description
    return [line.split(":", 1)[1].strip() for line in head.splitlines() if line.startswith("Requires-Dist:")]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _marker_env(python_version, machine):
    major, minor = str(python_version).split(".")[:2]
    return {"python_version": f"{major}.{minor}", "python_full_version": f"{major}.{minor}.0",
            "sys_platform": "linux", "platform_system": "Linux", "platform_machine": machine, "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "implementation_version": f"{major}.{minor}.0", "platform_release": "", "platform_version": "",
            "extra": ""}


def _index(wheels, python_version, machine):
    """{name: {version: [paths]}} of the wheels that fit the node."""
    idx = {}
    for path in wheels:
        if wheel_fits(path, python_version, machine):
            w = parse_wheel(path)
            idx.setdefault(w["name"], {}).setdefault(w["version"], []).append(path)
    return idx


def lock(wheels, roots, python_version, machine="x86_64", hasher=sha256):
    """Resolve ``roots`` in ``wheels`` -> dict(lines, pins, files, missing).

    ``lines``: requirement lines ``name==version --hash=sha256:...`` (sorted by name) for
    ``pip install --require-hashes -r``; ``pins``: {name: version}; ``files``: the wheel
    file names pinned (what the node's wheelhouse must hold); ``missing``: the
    requirements no fitting wheel satisfies (or that conflict with a pin), each said
    with what the wheelhouse has. ``hasher=None``: the lines carry no hashes (a look for what is
    missing reads no wheel whole: PyTorch's CPU wheel alone is 192 MB).
    """
    from packaging.requirements import Requirement
    from packaging.version import Version

    idx = _index(wheels, python_version, machine)
    env = _marker_env(python_version, machine)
    pins, missing, seen = {}, [], set()
    todo = [(r, "") for r in roots]
    while todo:
        text, extra = todo.pop(0)
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate(dict(env, extra=extra)):
            continue
        name = normalize(req.name)
        have = idx.get(name, {})
        if name in pins:
            if not req.specifier.contains(pins[name], prereleases=True):
                missing.append(f"{text} conflicts with {name}=={pins[name]}")
            continue
        fits = sorted((v for v in have if req.specifier.contains(v, prereleases=True)), key=Version)
        if not fits:
            found = ", ".join(sorted(have, key=Version)) or "none"
            missing.append(f"{text} (wheels for Python {python_version} {machine} in the wheelhouse: {found})")
            continue
        pins[name] = fits[-1]
        for path in have[fits[-1]]:
            for dep in requires_dist(path):
                for ex in [""] + sorted(req.extras):
                    if (dep, ex) not in seen:
                        seen.add((dep, ex))
                        todo.append((dep, ex))
    lines, files = [], []
    for name in sorted(pins):
        paths = idx[name][pins[name]]
        files += [os.path.basename(p) for p in paths]
        hashes = sorted({hasher(p) for p in paths}) if hasher is not None else []
        lines.append(" ".join([f"{name}=={pins[name]}"] + [f"--hash=sha256:{h}" for h in hashes]))
    return {"lines": lines, "pins": pins, "files": sorted(files), "missing": missing}
