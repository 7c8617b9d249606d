"""The recipe digest of a baked node image (module_utils/node_image_recipe.py, issue 43) is byte for byte what the
node_image role's Jinja computed before it had a home in Python: every baked image carries that digest as a tag,
so a different one would make each of them stale. REFERENCE is the role's former tasks (recipe.yml), run by
ansible-playbook over a tree with the cases ansible.builtin.find decides (a .pyc, a README.md, a hidden file, a
symbolic link, a subdirectory, a role that is missing) and a wheelhouse."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from ansible_collections.dynatrain.elastic.plugins.module_utils import node_image_recipe

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
BIN = os.path.dirname(sys.executable)

REFERENCE = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Read the files of the baked roles
      ansible.builtin.find:
        paths: "{{ node_image_recipe_roles | map('regex_replace', '^', role_path ~ '/../') | list }}"
        recurse: true
        file_type: file
        get_checksum: true
        excludes: ["*.pyc", "README.md"]
      register: _node_image_recipe_files

    - name: Compute the recipe digest
      ansible.builtin.set_fact:
        node_image_recipe: "{{ _node_image_recipe | to_json | hash('sha256') }}"
      vars:
        _node_image_roles_dir: "{{ (role_path ~ '/..') | realpath }}/"
        _node_image_recipe:
          files: >-
            {{ _node_image_recipe_files.files | map(attribute='path') | map('realpath')
               | map('replace', _node_image_roles_dir, '') | zip(_node_image_recipe_files.files | map(attribute='checksum'))
               | sort | list }}
          wheels: >-
            {{ (query('ansible.builtin.fileglob', node_image_wheelhouse_controller_dir ~ '/*.whl') | map('basename') | sort | list)
               if node_image_wheelhouse_controller_dir else [] }}
          base_ami: "{{ _node_image_base_id }}"
          instance_type: "{{ _node_image_bake_type }}"
          engine: "{{ node_image_engine }}"

    - name: Print it
      ansible.builtin.debug:
        msg: "DIGEST={{ node_image_recipe }}"
"""


def roles_tree(tmp_path):
    roles = tmp_path / "roles"
    for rel, text in {"node_base/tasks/main.yml": "---\n- name: x\n", "node_base/README.md": "left out\n",
                      "node_base/files/tool.pyc": "left out", "node_base/files/.hidden": "left out",
                      "node_base/templates/deep/a.j2": "{{ x }}\n", "launcher/defaults/main.yml": "a: 1\n",
                      "node_image/tasks/main.yml": "---\n", "other/tasks/main.yml": "not a baked role\n",
                      "launcher/.git-keep/inside.yml": "in a hidden directory: find walks into it\n"}.items():
        path = roles / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    os.symlink(str(roles / "launcher" / "defaults" / "main.yml"), str(roles / "node_base" / "files" / "link.yml"))
    wheels = tmp_path / "wheelhouse"
    wheels.mkdir()
    for name in ("mxnet-1.9.1-py3-none-any.whl", "a-1.0-py3-none-any.whl", "notes.txt"):
        (wheels / name).write_text("x")
    return roles, wheels


def reference_digest(tmp_path, roles, wheels, engine):
    play = tmp_path / "reference.yml"
    play.write_text(REFERENCE)
    extra = {"role_path": str(roles / "node_image"), "node_image_recipe_roles": ["node_base", "cuda", "launcher"],
             "node_image_wheelhouse_controller_dir": str(wheels) if wheels else "", "_node_image_base_id": "ami-0abc",
             "_node_image_bake_type": "c5.xlarge", "node_image_engine": engine}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "DT_"))}
    env.update(ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"))
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", str(play), "-e", json.dumps(extra),
                           "-e", "ansible_python_interpreter=" + sys.executable],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return re.search(r"DIGEST=([0-9a-f]{64})", proc.stdout).group(1)


@pytest.mark.parametrize("engine,with_wheels", [("mxnet", True), ("torch", False)])
def test_the_digest_is_the_roles_former_jinja(tmp_path, engine, with_wheels):
    roles, wheels = roles_tree(tmp_path)
    wheels = wheels if with_wheels else None
    document = node_image_recipe.recipe(str(roles / "node_image" / ".."), ["node_base", "cuda", "launcher"],
                                        str(wheels) if wheels else "", "ami-0abc", "c5.xlarge", engine)
    assert node_image_recipe.digest(document) == reference_digest(tmp_path, roles, wheels, engine)
    paths = [p for p, _sha in document["files"]]
    assert paths == ["launcher/.git-keep/inside.yml", "launcher/defaults/main.yml", "node_base/tasks/main.yml",
                     "node_base/templates/deep/a.j2"]
    assert document["wheels"] == (["a-1.0-py3-none-any.whl", "mxnet-1.9.1-py3-none-any.whl"] if wheels else [])


def test_the_digest_follows_what_the_image_holds(tmp_path):
    roles, wheels = roles_tree(tmp_path)
    args = (str(roles), ["node_base", "launcher"], str(wheels), "ami-0abc", "c5.xlarge", "mxnet")
    before = node_image_recipe.digest(node_image_recipe.recipe(*args))
    assert node_image_recipe.digest(node_image_recipe.recipe(*args)) == before
    (roles / "node_base" / "README.md").write_text("docs are not in the image\n")
    assert node_image_recipe.digest(node_image_recipe.recipe(*args)) == before
    (roles / "launcher" / "defaults" / "main.yml").write_text("a: 2\n")
    assert node_image_recipe.digest(node_image_recipe.recipe(*args)) != before
    assert node_image_recipe.digest(node_image_recipe.recipe(*args[:3], "ami-0def", *args[4:])) != \
        node_image_recipe.digest(node_image_recipe.recipe(*args))
