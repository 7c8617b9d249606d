# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""The recipe digest of a baked node image: what the image holds, as one sha256.

Its inputs: every file of the baked roles (their paths relative to roles/ and their sha1), the names of the
wheels in the controller wheelhouse, the base AMI, the builder's instance type and the engine. The digested
JSON (its keys, their order, the separators) is byte for byte what the node_image role's Jinja made before
this home existed (ansible.builtin.find, ``to_json``, ``hash('sha256')``): every baked image is tagged with
it, and a change to it makes each of them stale. tests/unit/plugins/module_utils/test_node_image_recipe.py
keeps that Jinja as its reference.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import json
import os
import stat

# what ansible.builtin.find left out (excludes); hidden files (a leading dot) too, as find does
EXCLUDES = ("*.pyc", "README.md")


def _sha1(path):
    h = hashlib.sha1()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 16), b""):
            h.update(block)
    return h.hexdigest()


def role_files(roles_dir, roles):
    """Sorted [path relative to roles_dir, sha1] of every regular file under roles_dir/<role> for each role:
    symbolic links and hidden names left out, symlinked directories not followed, as ansible.builtin.find
    (recurse, file_type=file) walks."""
    prefix = os.path.realpath(roles_dir) + "/"
    found = []
    for role in roles:
        top = os.path.join(roles_dir, role)
        if not os.path.isdir(top):
            continue
        for root, _dirs, files in os.walk(top):
            for name in files:
                if name.startswith(".") or any(fnmatch.fnmatch(name, pattern) for pattern in EXCLUDES):
                    continue
                path = os.path.normpath(os.path.join(root, name))
                if not stat.S_ISREG(os.lstat(path).st_mode):
                    continue
                found.append([os.path.realpath(path).replace(prefix, ""), _sha1(path)])
    return sorted(found)


def wheel_names(wheelhouse_dir):
    """The sorted file names of the wheels in the controller wheelhouse ([] when none is given)."""
    if not wheelhouse_dir:
        return []
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(wheelhouse_dir, "*.whl")) if os.path.isfile(p))


def recipe(roles_dir, roles, wheelhouse_dir, base_ami, instance_type, engine):
    """The digested document, in its key order."""
    return {"files": role_files(roles_dir, roles), "wheels": wheel_names(wheelhouse_dir), "base_ami": base_ami,
            "instance_type": instance_type, "engine": engine}


def digest(document):
    """sha256 of the document as Ansible's to_json writes it (json.dumps' default separators, ASCII)."""
    return hashlib.sha256(json.dumps(document).encode("utf-8")).hexdigest()
