# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""Directories and small files put on a node in one module run: the entries of dynatrain.elastic.node_files,
also applied by dynatrain.elastic.node_apply (a baked worker's whole configuration in one module run)."""

from __future__ import annotations

import os
import re
import tempfile

from ansible.module_utils.common.text.converters import to_bytes


def _attributes(module, entry, changed):
    """Owner, group and mode where they differ (check mode: only says so)."""
    args = module.load_file_common_arguments({k: entry.get(k) for k in ("path", "owner", "group", "mode")})
    return module.set_fs_attributes_if_different(args, changed)


def _directory(module, entry):
    path = entry["path"]
    if os.path.isdir(path):
        return _attributes(module, entry, False)
    if os.path.lexists(path):
        module.fail_json(msg="%s exists and is not a directory: remove it or choose another path." % path)
    if module.check_mode:
        return True
    os.makedirs(path)
    return _attributes(module, entry, True)


def _file(module, entry, data=None):
    path = entry["path"]
    if data is None:
        if entry.get("content") is None:
            module.fail_json(msg="%s: state=file needs content (the whole file, as text)." % path)
        data = to_bytes(entry["content"], errors="surrogate_or_strict")
    if os.path.isdir(path):
        module.fail_json(msg="%s is a directory: a file cannot replace it." % path)
    current = None
    if os.path.isfile(path):
        with open(path, "rb") as fh:
            current = fh.read()
    if current == data:
        return _attributes(module, entry, False)
    if module.check_mode:
        return True
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        module.fail_json(msg="%s: its directory %s does not exist; list it before the file (state=directory)."
                         % (path, directory))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".%s." % os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        module.atomic_move(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return _attributes(module, entry, True)


def _text(path):
    """The file's text as it is (any bytes kept), or "" when there is none: what a line or block entry edits."""
    if not os.path.isfile(path):
        return ""
    with open(path, "rb") as fh:
        return fh.read().decode("utf-8", "surrogateescape")


def with_line(text, line, match):
    """``text`` with ``line`` in place of the lines ``match`` finds (where the first was), or appended. Pure."""
    lines = text.splitlines()
    found = [i for i, have in enumerate(lines) if (re.search(match, have) if match else have == line)]
    if found:
        lines = [have for i, have in enumerate(lines) if i not in found[1:]]
        lines[found[0]] = line
    else:
        lines.append(line)
    return "\n".join(lines) + "\n"


def _line(module, entry):
    path = entry["path"]
    if entry.get("line") is None or "\n" in entry["line"]:
        module.fail_json(msg="%s: state=line needs line (one line of text, no newline)." % path)
    if entry.get("match"):
        try:
            re.compile(entry["match"])
        except re.error as e:
            module.fail_json(msg="%s: match %r is not a regular expression: %s." % (path, entry["match"], e))
    text = with_line(_text(path), entry["line"], entry.get("match"))
    return _file(module, entry, to_bytes(text, errors="surrogate_or_strict"))


def with_block(text, block, marker):
    """``text`` with ``block`` between the marker lines (``marker`` with {mark} as BEGIN and END), in place of
    the block there was, or appended; no block (empty) removes it. As ansible.builtin.blockinfile makes it, so
    a node configured either way reads the same file. Pure."""
    begin, end = marker.replace("{mark}", "BEGIN"), marker.replace("{mark}", "END")
    lines = text.splitlines()
    where = len(lines)
    starts = [i for i, have in enumerate(lines) if have.rstrip("\r") == begin]
    ends = [i for i, have in enumerate(lines) if have.rstrip("\r") == end]
    if starts and ends:
        first, last = sorted((starts[-1], ends[-1]))
        del lines[first:last + 1]
        where = first
    lines[where:where] = [begin] + block.splitlines() + [end] if block else []
    return "\n".join(lines) + "\n" if lines else ""


def _block(module, entry):
    path = entry["path"]
    if not entry.get("marker") or "{mark}" not in entry["marker"]:
        module.fail_json(msg="%s: state=block needs marker, a line with {mark} (BEGIN and END)." % path)
    if not os.path.isfile(path) and not entry.get("content"):
        return False                    # no file, no block: nothing to remove
    text = with_block(_text(path), entry.get("content") or "", entry["marker"])
    return _file(module, entry, to_bytes(text, errors="surrogate_or_strict"))


def _absent(module, entry):
    path = entry["path"]
    if os.path.isdir(path) and not os.path.islink(path):
        module.fail_json(msg="%s is a directory: node_files removes files and links only." % path)
    if not os.path.lexists(path):
        return False
    if not module.check_mode:
        os.unlink(path)
    return True


APPLY = {"directory": _directory, "file": _file, "line": _line, "block": _block, "absent": _absent}

# The argument spec of one entry (node_files' and node_apply's O(files) elements).
ENTRY_OPTIONS = {
    "path": {"type": "path", "required": True},
    "state": {"type": "str", "choices": ["directory", "file", "line", "block", "absent"], "default": "file"},
    "content": {"type": "str"},
    "line": {"type": "str"},
    "match": {"type": "str"},
    "marker": {"type": "str"},
    "owner": {"type": "str"},
    "group": {"type": "str"},
    "mode": {"type": "raw"},
}


def apply_files(module, entries):
    """Apply the entries in order; the paths that were (in check mode: would be) changed."""
    changed_paths = []
    for entry in entries:
        if not os.path.isabs(entry["path"]):
            module.fail_json(msg="%s is not an absolute path." % entry["path"])
        if APPLY[entry["state"]](module, entry):
            changed_paths.append(entry["path"])
    return changed_paths
