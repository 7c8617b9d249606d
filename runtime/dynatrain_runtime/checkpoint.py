"""Checkpoints on the shared volume, committed atomically, and the exact-once audit.

Pure Python: the launcher picks the checkpoint to resume from without MXNet.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

from .host_worker_file import fsync_directory

CKPT_PREFIX = "ckpt-"


class CheckpointStore:
    """Checkpoints under ``directory`` as ``ckpt-<step>/`` directories.

    A checkpoint is written into a hidden temp directory, every file fsync'd, ``meta.json``
    last, then renamed into place in one ``rename``; old ones are renamed to a hidden trash
    name before being deleted.  A reader listing ``ckpt-*`` therefore only ever sees complete
    checkpoints.  The last ``keep`` are kept.
    """

    def __init__(self, directory, keep=2):
        self.directory = directory
        self.keep = max(1, int(keep))

    def path_for(self, step):
        return os.path.join(self.directory, f"{CKPT_PREFIX}{int(step):010d}")

    def steps(self):
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        out = []
        for name in names:
            if name.startswith(CKPT_PREFIX):
                try:
                    out.append(int(name[len(CKPT_PREFIX):]))
                except ValueError:
                    continue
        return sorted(out)

    def latest(self):
        """``(path, meta)`` of the newest checkpoint, or ``None``."""
        for _attempt in range(5):
            steps = self.steps()
            if not steps:
                return None
            path = self.path_for(steps[-1])
            try:
                with open(os.path.join(path, "meta.json")) as handle:
                    return path, json.load(handle)
            except (OSError, ValueError):
                time.sleep(0.05)   # pruned between listdir and open: list again
        return None

    @staticmethod
    def read(path):
        """``(path, meta)`` of the checkpoint at ``path``, or ``None`` (gone, or not one)."""
        try:
            with open(os.path.join(path, "meta.json")) as handle:
                return path, json.load(handle)
        except (OSError, ValueError, TypeError):
            return None

    def newest(self, reported=None):
        """The newest of ``latest()`` and the checkpoint at ``reported`` (a path its writer reported).

        The writer may be another node: on NFS the directory listing can lag behind (attribute
        caching), while opening a path it named is consistent (close-to-open), so the path the
        writer reported wins when it is newer than what the listing shows.
        """
        latest = self.latest()
        named = self.read(reported) if reported else None
        if named is not None and (latest is None or named[1].get("step", -1) > latest[1].get("step", -1)):
            return named
        return latest

    def write(self, step, meta, write_files=None):
        """Write checkpoint ``step``: ``write_files(tmpdir)`` adds the payload, then meta."""
        os.makedirs(self.directory, exist_ok=True)
        final = self.path_for(step)
        if os.path.isdir(final):
            return final       # same step = same committed state (e.g. resumed and stopped again)
        tmp = tempfile.mkdtemp(prefix=f".tmp-{CKPT_PREFIX}{int(step):010d}-", dir=self.directory)
        try:
            if write_files is not None:
                write_files(tmp)
            with open(os.path.join(tmp, "meta.json"), "w") as handle:
                json.dump(meta, handle, sort_keys=True)
            for name in os.listdir(tmp):
                with open(os.path.join(tmp, name), "rb") as handle:
                    os.fsync(handle.fileno())
            fsync_directory(tmp)
            os.chmod(tmp, 0o755)
            os.rename(tmp, final)
            fsync_directory(self.directory)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.prune()
        return final

    def prune(self):
        steps = self.steps()
        for old in steps[:-self.keep]:
            path = self.path_for(old)
            trash = os.path.join(self.directory, f".trash-{os.path.basename(path)}-{os.getpid()}")
            try:
                os.rename(path, trash)
            except OSError:
                continue
            shutil.rmtree(trash, ignore_errors=True)
        for name in os.listdir(self.directory):   # leftovers of a writer that died
            if name.startswith(".trash-"):
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)


def audit_check(audit, num_samples):
    """Verify a committed audit: every finished epoch used each sample exactly once.

    Returns a list of problems (empty = proven).  ``audit`` is the ``audit`` dict of a
    checkpoint's meta (``steps``: one record per committed global step).
    """
    problems = []
    by_epoch = {}
    for rec in audit.get("steps", []):
        by_epoch.setdefault(rec["epoch"], []).append(rec)
    for epoch, recs in sorted(by_epoch.items()):
        seen = {}
        for rec in recs:
            for i in rec["idx"]:
                seen[i] = seen.get(i, 0) + 1
            for i, count in rec.get("dup", {}).items():
                seen[int(i)] = seen.get(int(i), 0) + count - 1
        repeated = sorted(i for i, c in seen.items() if c > 1)
        complete = epoch in audit.get("completed_epochs", [])
        missing = sorted(set(range(num_samples)) - set(seen)) if complete else []
        if repeated:
            problems.append(f"epoch {epoch}: samples used more than once: {repeated[:20]}")
        if missing:
            problems.append(f"epoch {epoch}: samples never used: {missing[:20]}")
    return problems
