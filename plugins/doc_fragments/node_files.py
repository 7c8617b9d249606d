# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations


class ModuleDocFragment:
    """The ``files`` option of node_files and node_apply: one entry format (module_utils/node_files.py)."""

    DOCUMENTATION = r"""
options:
  files:
    description:
      - Directories, files, lines and removals to apply on the node, in this order. The files' contents are
        module arguments, so a task that writes a secret sets C(no_log=true).
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path on the node; a leading C(~) or C(~user) is expanded there (a user's home needs
          no lookup first).
        type: path
        required: true
      state:
        description:
          - C(directory), C(file) (with O(files[].content)), C(line) (with O(files[].line)), C(block) (with
            O(files[].content) and O(files[].marker)), C(known_hosts) (with O(files[].content)) or C(absent).
          - "A C(known_hosts) entry merges the known_hosts lines of O(files[].content) into the file under an
            exclusive lock on the sidecar C(<path>.lock) (the one the controller's M(dynatrain.elastic.known_hosts_pins)
            takes): each line replaces the lines that name any of its hosts, every other line stays. Two writers at
            once (two adds) keep each other's hosts; the file is never replaced whole."
          - A C(block) entry keeps the rest of the file and puts O(files[].content) between two marker lines, in
            place of the block there was, or at the end; an empty content removes the block. The file is the one
            M(ansible.builtin.blockinfile) makes.
        type: str
        choices: [directory, file, line, block, known_hosts, absent]
        default: file
      content:
        description: The whole content of a C(file), the text of a C(block), or the lines of a C(known_hosts) entry.
          Its directory must exist (list the directory first). A new file is created with its final owner, group and
          mode before its content is written (never readable under a wider mode in between).
        type: str
      marker:
        description: The marker line of a C(block), with C({mark}) for C(BEGIN) and C(END) (as
          M(ansible.builtin.blockinfile)'s O(ansible.builtin.blockinfile#module:marker)).
        type: str
      line:
        description: The line a C(line) entry makes (without its newline).
        type: str
      match:
        description: A regular expression (Python's C(re.search)) for the lines a C(line) entry replaces; without
          it, only the very same line is found.
        type: str
      owner:
        description: Owner (name or uid); unchanged when not given.
        type: str
      group:
        description: Group (name or gid); unchanged when not given.
        type: str
      mode:
        description: Mode, as M(ansible.builtin.file) takes it (e.g. C("0644")); unchanged when not given.
        type: raw
"""
