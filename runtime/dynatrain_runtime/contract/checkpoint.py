"""Checkpoints on the shared volume, committed atomically and verified, and the exact-once audit.

Pure Python: the launcher picks the checkpoint to resume from without MXNet.  Engine-neutral:
a checkpoint is a directory of files plus ``meta.json``, which records the sha256 digest of
every other file (``files``); ``verify`` / ``load_meta`` are the one check of a checkpoint,
used by the launcher before it names one to resume from and by every worker before it loads
one.  A checkpoint that does not verify is skipped for the newest one that does; when
checkpoints exist and none verifies, ``resume_point`` refuses (a silent start from step 0
would throw the job's progress away).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time

from .shared_volume import CHECKPOINT_META, CHECKPOINT_PREFIX, fsync_directory, open_nofollow

CKPT_PREFIX = CHECKPOINT_PREFIX
META = CHECKPOINT_META
DIGESTS = "files"              # meta.json: {relative path: {"sha256": hex, "bytes": n}} of every other file
TMP_PREFIX = f".tmp-{CKPT_PREFIX}"
TRASH_PREFIX = ".trash-"
TMP_MAX_AGE = 3600.0           # s: a .tmp-ckpt-* this old has no live writer (each file it creates touches it)
TMP_AGE_AT_START = 120.0       # s: at launcher start the last launcher's writers died with it (seconds)
_CHUNK = 1 << 20


class CheckpointError(Exception):
    """A checkpoint (or the checkpoint directory) that cannot be used; the message says why."""


class CheckpointGone(CheckpointError):
    """The checkpoint is not there (any more): pruned since it was listed, or never written."""


class NoValidCheckpoint(CheckpointError):
    """Checkpoints exist and none verifies: only a person can tell what to resume from."""


def _sha256(path):
    """``(sha256 hex, size)`` of the regular file ``path``, read without following a link."""
    digest = hashlib.sha256()
    with os.fdopen(open_nofollow(path), "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
        return digest.hexdigest(), handle.tell()


def _payload_files(path):
    """Relative paths (``/``-separated) of every file of the checkpoint at ``path`` but meta.json."""
    out = []
    for root, _dirs, names in os.walk(path):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), path).replace(os.sep, "/")
            if rel != META:
                out.append(rel)
    return sorted(out)


def digest_files(path):
    """``{relative path: {"sha256", "bytes"}}`` of the payload at ``path``, each file fsync'd on the way."""
    out = {}
    for rel in _payload_files(path):
        full = os.path.join(path, *rel.split("/"))
        digest = hashlib.sha256()
        with open(full, "rb") as handle:
            for chunk in iter(lambda: handle.read(_CHUNK), b""):
                digest.update(chunk)
            os.fsync(handle.fileno())
            size = handle.tell()
        out[rel] = {"sha256": digest.hexdigest(), "bytes": size}
    return out


def _check_file(path, rel, want):
    """Raise CheckpointError unless ``rel`` under ``path`` has the size and digest in ``want``."""
    parts = rel.split("/") if isinstance(rel, str) else [".."]
    if not isinstance(want, dict) or ".." in parts or os.path.isabs(rel):
        raise CheckpointError(f"{path}: meta.json lists an invalid file entry {rel!r}")
    full = os.path.join(path, *parts)
    try:
        got, size = _sha256(full)       # a link or a FIFO in a checkpoint is refused, never followed
    except FileNotFoundError:
        raise CheckpointError(f"{full} is missing") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {full}: {exc}") from None
    if size != want.get("bytes", size):
        raise CheckpointError(f"{full} has {size} bytes, meta.json says {want.get('bytes')}")
    if got != want.get("sha256"):
        raise CheckpointError(f"{full} does not match its digest in meta.json (damaged)")


def verify(path, meta):
    """Raise CheckpointError unless every file ``meta`` lists is at ``path`` with its sha256 digest,
    and every file at ``path`` is listed.

    A meta.json without digests never verifies: any node can write one on the shared volume
    (``{"step": 9999999999}``), and one that verified would become the resume point and S3's LATEST.
    A file that meta.json does not list (a link planted beside the payload) fails it too.
    """
    files = meta.get(DIGESTS) if isinstance(meta, dict) else None
    if files is None:
        raise CheckpointError(f"{path}: meta.json has no {DIGESTS!r} digests (not written by CheckpointStore)")
    if not isinstance(files, dict):
        raise CheckpointError(f"{path}: meta.json's {DIGESTS!r} is not a mapping")
    for rel, want in sorted(files.items()):
        _check_file(path, rel, want)
    extra = sorted(set(_payload_files(path)) - set(files))
    if extra:
        raise CheckpointError(f"{path}: files meta.json does not list: {extra[:5]}")


def read_meta(path):
    """The parsed meta.json of the checkpoint at ``path``, unverified; raises CheckpointError."""
    try:
        with os.fdopen(open_nofollow(os.path.join(path, META)), "rb") as handle:
            meta = json.loads(handle.read())
    except FileNotFoundError:
        if not os.path.isdir(path):
            raise CheckpointGone(f"{path} does not exist") from None
        raise CheckpointError(f"{path} has no {META}") from None
    except (OSError, ValueError, RecursionError) as exc:   # a torn or garbled meta.json is a ValueError
        raise CheckpointError(f"{path}/{META} cannot be read: {exc}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("step"), int) or isinstance(meta["step"], bool) \
            or meta["step"] < 0:
        raise CheckpointError(f"{path}/{META} is not a checkpoint's meta (no integer 'step')")
    return meta


def load_meta(path):
    """The meta of the checkpoint at ``path`` once its files verify (``verify``); raises CheckpointError."""
    meta = read_meta(path)
    verify(path, meta)
    return meta


def _identity(path):
    """What identifies the committed meta.json at ``path`` (a checkpoint directory never changes)."""
    try:
        st = os.stat(os.path.join(path, META))
    except (OSError, TypeError, ValueError):
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _stderr_warning(path, reason):
    print(f"dynatrain_runtime: checkpoint {path} skipped: {reason}", file=sys.stderr, flush=True)


class CheckpointStore:
    """Checkpoints under ``directory`` as ``ckpt-<step>/`` directories.

    A checkpoint is written into a hidden temp directory, every file fsync'd and digested,
    ``meta.json`` (with the digests) last, then renamed into place in one ``rename``; old ones
    are renamed to a hidden trash name before being deleted.  A reader listing ``ckpt-*``
    therefore only ever sees complete checkpoints, and one damaged afterwards does not verify.
    The last ``keep`` are kept, and always the newest one that verifies.  ``warn(path, reason)``
    hears about each checkpoint skipped as damaged (default: stderr).
    """

    def __init__(self, directory, keep=2, warn=None):
        self.directory = directory
        self.keep = max(1, int(keep))
        self.warn = warn or _stderr_warning
        self.damaged = {}               # path -> why it does not verify (each reported once)
        self._verified = {}             # path -> (identity of its meta.json, meta) once it verified

    def path_for(self, step):
        return os.path.join(self.directory, f"{CKPT_PREFIX}{int(step):010d}")

    def steps(self):
        """The steps of the committed checkpoints, sorted; raises CheckpointError when the listing fails."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []                   # nothing written yet
        except OSError as exc:          # not "no checkpoints": that would restart the job from step 0
            raise CheckpointError(f"cannot list {self.directory}: {exc}") from exc
        out = []
        for name in names:
            if name.startswith(CKPT_PREFIX):
                try:
                    out.append(int(name[len(CKPT_PREFIX):]))
                except ValueError:
                    continue
        return sorted(out)

    def load(self, path):
        """The meta of the checkpoint at ``path`` once it verifies (checked once per store and checkpoint)."""
        ident = _identity(path)
        cached = self._verified.get(path)
        if ident is not None and cached is not None and cached[0] == ident:
            return cached[1]
        meta = load_meta(path)
        self._verified[path] = (ident, meta)
        self.damaged.pop(path, None)
        return meta

    def forget(self, path):
        """Verify ``path`` again next time (a worker could not load it)."""
        self._verified.pop(path, None)

    def _skip(self, path, exc):
        if self.damaged.get(path) != str(exc):
            self.damaged[path] = str(exc)
            self.warn(path, str(exc))

    def read(self, path):
        """``(path, meta)`` of the checkpoint at ``path`` if it verifies, else ``None`` (gone, damaged, not one)."""
        if not path:
            return None
        try:
            return path, self.load(path)
        except CheckpointGone:
            return None
        except CheckpointError as exc:
            self._skip(path, exc)
            return None

    def latest(self):
        """``(path, meta)`` of the newest checkpoint that verifies, or ``None`` when none does.

        Newer ones that do not verify are reported (``warn``) and skipped.  Raises
        CheckpointError when the directory cannot be listed.
        """
        for _attempt in range(5):
            vanished = False
            for step in reversed(self.steps()):
                path = self.path_for(step)
                try:
                    return path, self.load(path)
                except CheckpointGone:
                    vanished = True     # pruned between the listing and the open: list again
                except CheckpointError as exc:
                    self._skip(path, exc)
            if not vanished:
                return None
            time.sleep(0.05)
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

    def resume_point(self, reported=None):
        """``newest(reported)``, or ``None`` when there is no checkpoint at all.

        Raises NoValidCheckpoint when checkpoints exist and none verifies: a fresh start would
        silently throw the job's progress away.
        """
        found = self.newest(reported)
        steps = self.steps() if found is None else []
        if not steps:
            return found
        why = "; ".join(f"{os.path.basename(self.path_for(s))}: {self.damaged.get(self.path_for(s), 'unreadable')}"
                        for s in reversed(steps[-5:]))
        raise NoValidCheckpoint(
            f"{len(steps)} checkpoint(s) in {self.directory} and none verifies ({why}); refusing to start "
            "from step 0: restore a good checkpoint (dt-checkpoint-restore --force from the job's S3 copy) "
            f"or, to really start over, move {self.directory} away")

    def write(self, step, meta, write_files=None):
        """Write checkpoint ``step``: ``write_files(tmpdir)`` adds the payload, then meta with its digests."""
        os.makedirs(self.directory, exist_ok=True)
        final = self.path_for(step)
        if os.path.isdir(final):
            if self.read(final) is not None:
                return final   # same step = same committed state (e.g. resumed and stopped again)
            self._discard(final)   # a damaged one must not stand in for this state
        tmp = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{int(step):010d}-", dir=self.directory)
        try:
            if write_files is not None:
                write_files(tmp)
            meta = dict(meta, **{DIGESTS: digest_files(tmp)})
            with open(os.path.join(tmp, META), "w") as handle:
                json.dump(meta, handle, sort_keys=True)
                handle.flush()
                os.fsync(handle.fileno())
            for root, _dirs, _names in os.walk(tmp):
                fsync_directory(root)
            os.chmod(tmp, 0o755)
            if not self._commit(tmp, final):
                return final       # another writer committed this step meanwhile
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._verified[final] = (_identity(final), meta)      # we just digested what we wrote
        self.prune(good=step)
        return final

    def _commit(self, tmp, final):
        """Rename ``tmp`` into place; False (``tmp`` removed) when ``final`` appeared meanwhile."""
        try:
            os.rename(tmp, final)
        except OSError:
            if not os.path.isdir(final):
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            return False
        fsync_directory(self.directory)
        return True

    def _discard(self, path):
        """Rename ``path`` to a trash name, then delete it (a listing never sees it half deleted)."""
        trash = os.path.join(self.directory, f"{TRASH_PREFIX}{os.path.basename(path)}-{os.getpid()}")
        try:
            os.rename(path, trash)
        except OSError:
            return
        self._verified.pop(path, None)
        shutil.rmtree(trash, ignore_errors=True)

    def _newest_good(self, steps, good=None):
        """The newest of ``steps`` that verifies (``good`` is known to: only newer ones are read)."""
        for step in reversed(steps):
            if step == good or self.read(self.path_for(step)) is not None:
                return step
        return None

    def prune(self, good=None):
        """Keep the newest ``keep`` checkpoints and the newest one that verifies; remove leftovers.

        ``good``: a step known to verify (the one just written).  When none verifies nothing is
        removed: a person may still repair one.
        """
        try:
            steps = self.steps()
        except CheckpointError as exc:
            self.warn(self.directory, f"not pruned: {exc}")
            return
        newest_good = self._newest_good(steps, good)
        if newest_good is not None:
            keep = set(steps[-self.keep:]) | {newest_good}
            for old in steps:
                if old not in keep:
                    self._discard(self.path_for(old))
        self.clean()

    def clean(self, max_age=TMP_MAX_AGE):
        """Remove what dead writers left: a prune's trash, and ``.tmp-ckpt-*`` not touched for ``max_age`` s.

        A live writer's temp directory is younger: creating each file touches it.  Returns the names removed.
        """
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        removed = []
        for name in names:
            path = os.path.join(self.directory, name)
            if name.startswith(TMP_PREFIX):
                try:
                    if time.time() - os.stat(path).st_mtime < max_age:
                        continue
                except OSError:
                    continue
            elif not name.startswith(TRASH_PREFIX):
                continue
            shutil.rmtree(path, ignore_errors=True)
            removed.append(name)
        return removed


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
