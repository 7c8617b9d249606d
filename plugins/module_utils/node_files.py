# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""Directories and small files put on a node in one module run: the entries of dynatrain.elastic.node_files,
also applied by dynatrain.elastic.node_apply (a baked worker's whole configuration in one module run)."""

from __future__ import annotations

import errno
import os
import re
import stat
import tempfile

from ansible.module_utils.common.text.converters import to_bytes
from ansible_collections.dynatrain.elastic.plugins.module_utils import known_hosts


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
    _replace(module, entry, data)
    return _attributes(module, entry, True)


def _final_mode(module, entry, have):
    """The mode the file ends with: the entry's (octal or symbolic, as ansible.builtin.file takes it), else the
    file's own (``have``: its stat, or None), else what a new file gets under the umask (as atomic_move gives)."""
    umask = os.umask(0)
    os.umask(umask)
    base = stat.S_IMODE(have.st_mode) if have is not None else 0o666 & ~umask
    mode = entry.get("mode")
    if mode is None:
        return base
    if isinstance(mode, int):
        return mode
    try:
        return int(str(mode), 8)
    except ValueError:
        pass
    try:
        wanted = module._symbolic_mode_to_octal(os.stat_result((stat.S_IFREG | base,) + (0,) * 9), str(mode))
    except Exception as e:  # ansible's parser raises ValueError and others on a bad symbolic mode
        module.fail_json(msg="%s: mode %r is neither octal nor symbolic: %s" % (entry["path"], mode, e))
    if wanted != stat.S_IMODE(wanted):
        module.fail_json(msg="%s: mode %r has more than permission bits." % (entry["path"], mode))
    return wanted


def _replace(module, entry, data):
    """Replace the file with ``data`` atomically, the new file holding its final owner, group and mode before a
    byte of it is written: a temporary file in its directory (mkstemp: 0600, whatever the umask), given its
    owner and group while it is empty, then its mode (fchmod: no umask), then the content, then the rename. So no
    reader ever finds the content under a wider mode (a secret created 0644 and chmodded to 0600 after was
    readable in between, and an fd opened then stays readable)."""
    path = entry["path"]
    have = os.stat(path) if os.path.isfile(path) else None
    mode = _final_mode(module, entry, have)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".%s." % os.path.basename(path))
    try:
        if have is not None:
            try:    # the file's own owner and group stay, as atomic_move keeps them (root only)
                os.fchown(fd, have.st_uid, have.st_gid)
            except PermissionError:
                pass
        module.set_owner_if_different(tmp, entry.get("owner"), False)
        module.set_group_if_different(tmp, entry.get("group"), False)
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fd = None
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        context = module.selinux_context(path) if have is not None and module.selinux_enabled() else None
        os.rename(tmp, path)
        if module.selinux_enabled():
            module.set_context_if_different(path, context or module.selinux_default_context(path), False)
    finally:
        if fd is not None:
            os.close(fd)
        if os.path.lexists(tmp):
            os.unlink(tmp)


def _text(module, path):
    """The file's text as it is (any bytes kept), or "" when there is none: what a line, block or known_hosts entry
    edits. A link is refused, never followed: these files sit in a user's directory, and the text read is written
    back (a link to /etc/shadow planted by the node user would have its lines copied into a file the user reads)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return ""
    except OSError as e:
        if e.errno == errno.ELOOP:
            module.fail_json(msg="%s is a link: refused (its target's text would be copied into the file). Remove the"
                                 " link; nothing was changed." % path)
        raise
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return ""
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
    text = with_line(_text(module, path), entry["line"], entry.get("match"))
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
    text = with_block(_text(module, path), entry.get("content") or "", entry["marker"])
    return _file(module, entry, to_bytes(text, errors="surrogate_or_strict"))


class _LockBusy(Exception):
    """Another writer held a known_hosts file's lock past the wait."""


def _known_hosts(module, entry):
    """The lines of O(files[].content) merged into a known_hosts file under the lock its other writers take: each
    given line replaces the lines naming any of its hosts, every other line stays (another add's workers, pinned
    by a run that read the controller's copy before this one's pins). Never the file replaced whole."""
    path = entry["path"]
    if entry.get("content") is None:
        module.fail_json(msg="%s: state=known_hosts needs content (the known_hosts lines to pin)." % path)
    if os.path.isdir(path):
        module.fail_json(msg="%s is a directory: a file cannot replace it." % path)
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        module.fail_json(msg="%s: its directory %s does not exist; list it before the file (state=directory)."
                         % (path, directory))
    lines = entry["content"].splitlines()
    if module.check_mode:       # no lock file made: check mode changes nothing
        text = known_hosts.merge(_text(module, path), lines)[0]
        return _file(module, entry, to_bytes(text, errors="surrogate_or_strict"))
    try:
        with known_hosts.locked(path, error=_LockBusy):
            text = known_hosts.merge(_text(module, path), lines)[0]
            return _file(module, entry, to_bytes(text, errors="surrogate_or_strict"))
    except _LockBusy as e:
        module.fail_json(msg="%s: %s; nothing was changed." % (path, e))


def _absent(module, entry):
    path = entry["path"]
    if os.path.isdir(path) and not os.path.islink(path):
        module.fail_json(msg="%s is a directory: node_files removes files and links only." % path)
    if not os.path.lexists(path):
        return False
    if not module.check_mode:
        os.unlink(path)
    return True


APPLY = {"directory": _directory, "file": _file, "line": _line, "block": _block, "known_hosts": _known_hosts,
         "absent": _absent}

# The argument spec of one entry (node_files' and node_apply's O(files) elements).
ENTRY_OPTIONS = {
    "path": {"type": "path", "required": True},
    "state": {"type": "str", "choices": ["directory", "file", "line", "block", "known_hosts", "absent"],
              "default": "file"},
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
