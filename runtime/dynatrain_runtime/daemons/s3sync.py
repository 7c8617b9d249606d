"""A job's checkpoints and files copied to S3 (``dt-checkpoint-sync``) and restored onto a fresh volume
(``dt-checkpoint-restore``), so a job outlives its cluster.

Layout under ``s3://<bucket>/<prefix>/``: ``checkpoints/ckpt-<step>/<file>`` (``meta.json`` uploaded
last), ``LATEST.json`` (written only once every object of the checkpoint it names is uploaded and read
back to its digest, and only ever forward -- but for a new run on the same prefix, below), and copies of ``host_worker_log``, ``events.jsonl``, ``status.json``,
``results/final.json`` and ``logs/launcher.log``.  boto3 is imported lazily: ``import
dynatrain_runtime`` stays standard-library only (the ``s3`` extra brings boto3).

The volume is written by every node, so the sync trusts nothing on it: a checkpoint is uploaded only
when it verifies (meta.json's digests, which every checkpoint has), and then exactly the files meta.json
lists (nested ones too), each opened without following a link and hashed on the way to S3; a job file
(``results/final.json``...) that is a link is not uploaded.  A new run on the same prefix (the user
moved ``checkpoints/`` away and started over: the newest local checkpoint is below LATEST and S3 does
not hold it) is backed up, LATEST moving back to it, and said; a pass that fails is ``error`` in
``control/s3sync.json`` (what ``job_info`` / ``status.yml`` show, and the launcher's metrics read:
``ok``, ``failed_passes``), and the turn from success to failure and back is an event in
``events.jsonl`` (``checkpoint_sync_failed`` / ``checkpoint_sync_recovered``, as is a new run,
``checkpoint_sync_new_run``): a backup that stops is seen where the job's other news is.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time

from ..contract.checkpoint import CKPT_PREFIX, DIGESTS, META, CheckpointError, CheckpointStore, read_meta, verify
from ..contract.shared_volume import (EVENTS_FILE, HOST_WORKER_LOG_FILE, LAUNCHER_LOG, RESULT_FILE, STATUS_FILE,
                                      JobFiles, NotRegularFile, append_jsonl, clean_text, fsync_directory,
                                      open_nofollow, read_bytes, read_json, write_json)

EVENT_SOURCE = "checkpoint-sync"           # the ``source`` of the sync's records in events.jsonl
SSE = {"ServerSideEncryption": "AES256"}     # buckets encrypt by default too: belt and braces
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")
_SEGMENT = re.compile(r"[A-Za-z0-9!_.*'()=+@,:-]+")     # S3's safe key characters, and a few
_LATEST_CKPT = re.compile(r"checkpoints/(ckpt-\d{10})/")


class UserError(Exception):
    """A mistake the caller can fix (bad URL, nothing to restore, would mix two jobs): exit 2."""


class Stopped(Exception):
    """SIGTERM and the grace time is over: stop between two objects."""


def parse_url(url):
    """``s3://bucket/prefix[/]`` -> ``(bucket, "prefix/")`` (``""`` for the bucket's root)."""
    match = re.fullmatch(r"s3://([^/]*)(?:/(.*))?", str(url or ""))
    if not match or not _BUCKET.fullmatch(match.group(1)):
        raise UserError(f"not an S3 URL: {url!r} (expected s3://<bucket>/<cluster>/<job>/)")
    parts = (match.group(2) or "").rstrip("/").split("/")
    if parts == [""]:
        return match.group(1), ""
    if any(p in (".", "..") or not _SEGMENT.fullmatch(p) for p in parts):
        raise UserError(f"bad S3 prefix in {url!r}: empty, '.' or '..' parts, or characters other than "
                        f"letters, digits and !_.*'()=+@,:-")
    return match.group(1), "/".join(parts) + "/"


def make_client():
    """The S3 client: default credentials (the instance profile on AWS); path style for an endpoint URL."""
    import boto3
    from botocore.config import Config
    opts = {"retries": {"max_attempts": 5, "mode": "standard"}, "connect_timeout": 10, "read_timeout": 60}
    if os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3"):
        opts["s3"] = {"addressing_style": "path"}     # the local cloud (moto) has no bucket DNS names
    return boto3.client("s3", config=Config(**opts))


def error_code(exc):
    return (getattr(exc, "response", None) or {}).get("Error", {}).get("Code")


def explain(exc, url):
    """One line that says what went wrong with ``url``."""
    code = error_code(exc)
    if code == "NoSuchBucket":
        return f"NoSuchBucket: the bucket of {url} does not exist"
    if code in ("AccessDenied", "403"):
        return f"AccessDenied on {url}: this node's credentials (instance profile) lack s3 rights on it"
    if code:
        return f"{code}: {exc} ({url})"
    return f"{type(exc).__name__}: {exc} ({url})"


def read_latest(s3, bucket, prefix):
    """``LATEST.json`` under ``prefix`` as a dict, or ``None`` when there is none."""
    try:
        body = s3.get_object(Bucket=bucket, Key=prefix + "LATEST.json")["Body"].read()
    except Exception as exc:            # noqa: BLE001 - botocore's ClientError, imported lazily
        if error_code(exc) in ("NoSuchKey", "404"):
            return None
        raise
    return json.loads(body)


class _Hashing:
    """A file object read for an upload that digests what it gives (the bytes S3 got, exactly)."""

    def __init__(self, handle):
        self.handle, self.digest, self.size = handle, hashlib.sha256(), 0

    def read(self, size=-1):
        data = self.handle.read(size)
        self.digest.update(data)
        self.size += len(data)
        return data


class _Head:
    """The first ``n`` bytes of an open file (a log's complete lines; its last one may be half-written)."""

    def __init__(self, handle, n):
        self.handle, self.left = handle, n

    def read(self, size=-1):
        size = self.left if size is None or size < 0 else min(size, self.left)
        data = self.handle.read(size)
        self.left -= len(data)
        return data


def complete_lines_length(handle, size):
    handle.seek(max(0, size - 65536))
    tail = handle.read(size - handle.tell())
    cut = tail.rfind(b"\n")
    handle.seek(0)
    return size if cut < 0 else size - len(tail) + cut + 1


class Sync:
    """One job's copy to S3: ``run_pass()`` uploads what is new; ``run()`` loops until SIGTERM."""

    def __init__(self, efs, url, keep=2, checkpoint_dir=None, client=None):
        self.bucket, self.prefix = parse_url(url)
        self.url = f"s3://{self.bucket}/{self.prefix}"
        self.files = JobFiles(efs, checkpoint_dir)
        self.keep = max(1, int(keep))
        self.s3 = client or make_client()
        self.state_path = self.files.s3sync_state
        old = read_json(self.state_path)
        old = old if isinstance(old, dict) else {}         # the volume is anyone's: any shape
        uploaded = old.get("uploaded_bytes") if old.get("url") == self.url else 0
        self.uploaded_bytes = uploaded if isinstance(uploaded, int) and uploaded >= 0 else 0
        failed = old.get("failed_passes") if old.get("url") == self.url else 0
        self.failed_passes = failed if isinstance(failed, int) and failed >= 0 else 0   # the metrics' counter
        self.last_step, self.error, self.last_ok = None, None, None
        # The error an event said last: a restart of the sync in the middle of a failure says its recovery.
        said = old.get("error") if old.get("url") == self.url else None
        self._said_error = said if isinstance(said, str) else None
        self.skipped = {}             # local checkpoint name -> why it is not uploaded (it does not verify)
        self.restarted = None         # the last new run found on this prefix (LATEST moved back to it)
        self.seen = {}                # job file key -> (size, mtime_ns) last uploaded
        self.deadline = None          # set by SIGTERM: stop between objects after it
        self._pruned = self._warned = False
        self._logged = (None, 0.0)

    # ------------------------------------------------------------------ S3 primitives
    def _check_stop(self):
        if self.deadline is not None and time.time() > self.deadline:
            raise Stopped()

    def _upload(self, fileobj, key, size):
        from boto3.s3.transfer import TransferConfig
        self._check_stop()
        self.s3.upload_fileobj(fileobj, self.bucket, self.prefix + key, ExtraArgs=dict(SSE),
                               Config=TransferConfig(max_concurrency=2))   # gentle beside training
        self.uploaded_bytes += size

    def _put_json(self, key, obj):
        body = json.dumps(obj, sort_keys=True).encode()
        self.s3.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=body,
                           ContentType="application/json", **SSE)
        self.uploaded_bytes += len(body)

    # ------------------------------------------------------------------ checkpoints
    def _local_meta(self, path):
        """``(meta.json bytes, meta)`` of a local checkpoint once it verifies; ``None`` when it went away
        or does not verify (said once, and kept in ``skipped`` for the state file)."""
        name = os.path.basename(path)
        try:
            meta_bytes = read_bytes(os.path.join(path, META))
            meta = read_meta(path)
            verify(path, meta)        # a damaged or forged checkpoint never becomes S3's LATEST
        except (OSError, CheckpointError) as exc:
            if not os.path.isdir(path):
                return None           # pruned (renamed to .trash-) between the listing and now
            if self.skipped.get(name) != str(exc):
                self.log(f"not uploading {name}: {exc}")
            self.skipped[name] = str(exc)
            return None
        self.skipped.pop(name, None)
        return meta_bytes, meta

    def _remote_meta(self, name):
        """The bytes of ``checkpoints/<name>/meta.json`` in S3, or ``None``."""
        try:
            return self.s3.get_object(Bucket=self.bucket, Key=f"{self.prefix}checkpoints/{name}/{META}")["Body"].read()
        except Exception as exc:        # noqa: BLE001 - botocore's ClientError, imported lazily
            if error_code(exc) in ("NoSuchKey", "404"):
                return None
            raise

    def _clear_remote(self, name, meta_bytes):
        """Objects of another checkpoint under this name (an earlier run's): removed, meta.json first, so
        a mix of the two is never complete."""
        if self._remote_meta(name) == meta_bytes:
            return
        base = f"{self.prefix}checkpoints/{name}/"
        stale = [o["Key"] for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base)
                 for o in page.get("Contents", [])]
        for batch in ([k for k in stale if k == base + META], [k for k in stale if k != base + META]):
            if batch:
                self._delete(batch)

    def _upload_checkpoint(self, path):
        """Upload one committed checkpoint that verifies, meta.json last; ``None`` when it went away
        meanwhile or does not verify.  Exactly the files meta.json lists go, each hashed on its way:
        one that changed since it verified fails the pass (LATEST stays), a link is never followed."""
        name = os.path.basename(path)
        local = self._local_meta(path)
        if local is None:
            return None
        meta_bytes, meta = local
        self._clear_remote(name, meta_bytes)
        for rel, want in sorted(meta[DIGESTS].items()):
            try:
                # Once open, a prune (rename + unlink) cannot change what we read: it is immutable.
                with os.fdopen(open_nofollow(os.path.join(path, *rel.split("/"))), "rb") as handle:
                    reader = _Hashing(handle)
                    self._upload(reader, f"checkpoints/{name}/{rel}", os.fstat(handle.fileno()).st_size)
            except OSError:
                if not os.path.isdir(path):
                    return None
                raise
            if reader.digest.hexdigest() != want.get("sha256") or reader.size != want.get("bytes", reader.size):
                raise CheckpointError(f"{path}/{rel} changed while it was uploaded: {name} not committed in S3")
        self._check_stop()
        self.s3.put_object(Bucket=self.bucket, Key=f"{self.prefix}checkpoints/{name}/{META}",
                           Body=meta_bytes, ContentType="application/json", **SSE)
        self.uploaded_bytes += len(meta_bytes)
        return meta

    def _new_run(self, store, steps, done):
        """The step of the newest local checkpoint when it is a new run's (below LATEST, and S3 does not
        hold it: the user moved ``checkpoints/`` away and started over), else None."""
        if done < 0 or not steps or steps[-1] >= done:
            return None
        for step in reversed(steps):
            local = self._local_meta(store.path_for(step))
            if local is not None:
                return None if self._remote_meta(os.path.basename(store.path_for(step))) == local[0] else step
        return None

    def sync_checkpoints(self):
        latest = read_latest(self.s3, self.bucket, self.prefix)
        if latest is not None and not (isinstance(latest, dict) and isinstance(latest.get("step"), int)):
            raise RuntimeError(f"malformed {self.url}LATEST.json: {json.dumps(latest)[:200]}")
        done = latest["step"] if latest else -1
        self.last_step = done if latest else None
        store = CheckpointStore(self.files.checkpoints)
        steps = store.steps()
        restart = self._new_run(store, steps, done)
        if restart is not None:
            self.restarted = {"time": time.time(), "step": restart, "previous_latest": done}
            self.log(f"a new run on {self.url}: the local checkpoints (newest {restart}) are below LATEST.json "
                     f"(step {done}) and not in S3; backing them up, LATEST moves back to them")
            self.event("checkpoint_sync_new_run", url=self.url, step=restart, previous_latest=done)
            done = -1
        elif steps and steps[-1] < done and not self._warned:
            self._warned = True
            self.log(f"{self.url}LATEST.json is at step {done}, ahead of the local checkpoints "
                     f"(newest {steps[-1]}, which S3 holds): nothing to upload")
        moved = False
        for step in [s for s in steps if s > done][-self.keep:]:   # older ones would be pruned at once
            path = store.path_for(step)
            meta = self._upload_checkpoint(path)
            if meta is None:
                continue
            name = os.path.basename(path)
            self._put_json("LATEST.json", {"checkpoint": f"checkpoints/{name}/", "step": step,
                                           "epoch": meta.get("epoch"), "time": time.time()})
            self.last_step, moved = step, True
            self.log(f"uploaded {name} -> {self.url}checkpoints/{name}/")
        if self.last_step is not None and (moved or not self._pruned):
            self.prune(self.last_step)
            self._pruned = True

    def prune(self, latest_step):
        """Delete S3 checkpoints older than LATEST's beyond the newest ``keep`` complete ones."""
        base = self.prefix + "checkpoints/"
        keys, complete = {}, set()
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base):
            for obj in page.get("Contents", []):
                name, _sep, leaf = obj["Key"][len(base):].partition("/")
                step = name[len(CKPT_PREFIX):]
                if not (name.startswith(CKPT_PREFIX) and step.isdigit()):
                    continue
                keys.setdefault(int(step), []).append(obj["Key"])
                if leaf == META:
                    complete.add(int(step))
        kept = set(sorted(s for s in complete if s <= latest_step)[-self.keep:])
        # Steps above LATEST are left alone: only this process writes there, and never concurrently.
        doomed = [k for s, ks in keys.items() if s < latest_step and s not in kept for k in ks]
        self._delete(doomed)

    def _delete(self, doomed):
        for i in range(0, len(doomed), 1000):
            resp = self.s3.delete_objects(Bucket=self.bucket, Delete={
                "Objects": [{"Key": k} for k in doomed[i:i + 1000]], "Quiet": True})
            if resp.get("Errors"):
                err = resp["Errors"][0]
                raise RuntimeError(f"cannot delete {err.get('Key')}: {err.get('Code')} {err.get('Message')}")

    # ------------------------------------------------------------------ the job's other files
    def job_files(self):
        """(S3 key, local path, append-only lines?) of the job files copied when they change."""
        f = self.files
        return [(HOST_WORKER_LOG_FILE, f.log, True), (EVENTS_FILE, f.events, True),
                (STATUS_FILE, f.status, False), (RESULT_FILE, f.result, False), (LAUNCHER_LOG, f.launcher_log, True)]

    def sync_files(self):
        refused = []
        for key, path, lines in self.job_files():
            try:
                handle = os.fdopen(open_nofollow(path), "rb")     # a link (to the master's key) is not copied
            except FileNotFoundError:
                continue
            except OSError as exc:          # the others are still copied; the pass is an error
                if not isinstance(exc, NotRegularFile) and exc.errno != errno.ELOOP:
                    raise
                refused.append(f"{path} is a link or not a regular file: not uploaded")
                continue
            with handle:
                st = os.fstat(handle.fileno())
                sig = (st.st_size, st.st_mtime_ns)
                if self.seen.get(key) == sig:
                    continue
                size = complete_lines_length(handle, st.st_size) if lines else st.st_size
                self._upload(_Head(handle, size), key, size)
                self.seen[key] = sig
        if refused:
            raise RuntimeError("; ".join(refused))

    # ------------------------------------------------------------------ the loop
    def log(self, text):
        print(f"dt-checkpoint-sync: {text}", file=sys.stderr, flush=True)

    def event(self, event, **fields):
        """One record in the job's ``events.jsonl`` (the shared volume's append: its lock, no link followed);
        one that cannot be written is said in the sync's log, never fatal (the volume may be what failed)."""
        try:
            append_jsonl(self.files.events, dict(fields, event=event, time=time.time(), source=EVENT_SOURCE))
        except (OSError, ValueError, TypeError) as exc:    # a lock timeout is a ValueError
            self.log(f"cannot append {event} to {self.files.events}: {exc}")

    def _say_transition(self):
        """An event when the passes turn from success to failure and back (not one per failed pass:
        a sync that fails every 5 s for a day would otherwise fill the events)."""
        if self.error is not None and self._said_error is None:
            self.event("checkpoint_sync_failed", url=self.url, error=clean_text(self.error, 400),
                       failed_passes=self.failed_passes)
            self._said_error = self.error
        elif self.error is None and self._said_error is not None:
            self.event("checkpoint_sync_recovered", url=self.url, last_step=self.last_step,
                       failed_passes=self.failed_passes)
            self._said_error = None

    def run_pass(self):
        """One pass; ``True`` when it succeeded.  Never raises but ``Stopped``."""
        try:
            self.sync_checkpoints()
            self.sync_files()
            self.error, self.last_ok = None, time.time()
        except Stopped:
            raise
        except Exception as exc:       # noqa: BLE001 - network, credentials, bucket: retried next pass
            self.error = explain(exc, self.url)
            self.failed_passes += 1
            if self._logged[0] != self.error or time.time() - self._logged[1] > 60:
                self.log(f"pass failed: {self.error}")
                self._logged = (self.error, time.time())
        finally:
            self.write_state()
            self._say_transition()
        return self.error is None

    def write_state(self):
        state = {"url": self.url, "last_step": self.last_step, "last_pass_time": time.time(),
                 "last_ok_time": self.last_ok, "uploaded_bytes": self.uploaded_bytes, "error": self.error,
                 "ok": self.error is None, "failed_passes": self.failed_passes,
                 "skipped": dict(sorted(self.skipped.items())[-5:]), "restarted": self.restarted}
        try:
            write_json(self.state_path, state)
        except OSError as exc:
            self.log(f"cannot write {self.state_path}: {exc}")

    def run(self, interval=5.0, once=False, grace=20.0):
        """Pass every ``interval`` s.  SIGTERM: a last pass within ``grace`` s, then exit 0."""
        def on_term(_signum, _frame):
            now = time.time()
            self.deadline = now if self.deadline is not None else now + grace   # a second one: at once

        old = signal.signal(signal.SIGTERM, on_term)
        try:
            while True:
                try:
                    ok = self.run_pass()
                except Stopped:
                    return 0
                if once:
                    return 0 if ok else 1
                if self.deadline is not None:
                    return 0          # that was the final pass
                until = time.time() + interval
                while time.time() < until and self.deadline is None:
                    time.sleep(min(0.2, interval))
        finally:
            signal.signal(signal.SIGTERM, old)


# ---------------------------------------------------------------------- restore
def _chown(path, owner):
    if owner is not None:
        os.chown(path, *owner)


def parse_owner(text):
    """``user[:group]`` -> ``(uid, gid)``."""
    import grp
    import pwd
    user, _sep, group = text.partition(":")
    try:
        pw = pwd.getpwnam(user)
        return pw.pw_uid, (grp.getgrnam(group).gr_gid if group else pw.pw_gid)
    except KeyError as exc:
        raise UserError(f"--owner {text}: no such user or group") from exc


def _download(s3, bucket, key, dest, owner):
    """``key`` -> ``dest`` atomically (temp file + rename), mode 0644; ``False`` when there is no such key."""
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(dest)}.", dir=os.path.dirname(dest))
    try:
        with os.fdopen(fd, "wb") as handle:
            s3.download_fileobj(bucket, key, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        _chown(tmp, owner)
        os.rename(tmp, dest)
        return True
    except Exception as exc:            # noqa: BLE001 - ClientError is imported lazily
        os.unlink(tmp)
        if error_code(exc) in ("NoSuchKey", "404"):
            return False
        raise


def _has_content(path):
    try:
        return os.path.getsize(path) > 0
    except OSError:
        return False


def restore(efs, url, checkpoint_dir=None, force=False, owner=None, client=None):
    """Put the job at ``url`` onto the volume ``efs``; returns the JSON-able result."""
    bucket, prefix = parse_url(url)
    url = f"s3://{bucket}/{prefix}"
    if not os.path.isdir(efs):          # creating it would write the job onto the root disk
        raise UserError(f"{efs} is not a directory: mount the shared volume first")
    s3 = client or make_client()
    try:
        latest = read_latest(s3, bucket, prefix)
    except Exception as exc:            # noqa: BLE001
        if error_code(exc) == "NoSuchBucket":
            raise UserError(explain(exc, url)) from exc
        raise
    if latest is None:
        raise UserError(f"no checkpoint under {url}: LATEST.json not found — check resume_from "
                        f"(bucket/cluster/job) and that the old master's sync ran")
    match = _LATEST_CKPT.fullmatch(str(latest.get("checkpoint")))
    if not match or int(match.group(1)[len(CKPT_PREFIX):]) != latest.get("step"):
        raise RuntimeError(f"malformed {url}LATEST.json: {json.dumps(latest)}")
    step, files = int(latest["step"]), JobFiles(efs, checkpoint_dir)
    store = CheckpointStore(files.checkpoints)
    local = store.latest()
    local_step = int(os.path.basename(local[0])[len(CKPT_PREFIX):]) if local else None
    have_ckpt = local_step is not None and local_step >= step
    if _has_content(files.log) and not have_ckpt and not force:
        held = "no checkpoint" if local is None else f"an older checkpoint (step {local_step})"
        raise UserError(f"{files.log} has content but {files.checkpoints} holds {held}: restoring "
                        f"step {step} from {url} would mix two jobs; clear the volume or pass --force")
    changed = False
    if not os.path.isdir(files.checkpoints):
        os.makedirs(files.checkpoints, mode=0o755)
        os.chmod(files.checkpoints, 0o755)     # whatever the umask of a root caller
        _chown(files.checkpoints, owner)
    if not have_ckpt:
        final, changed = _download_checkpoint(s3, bucket, prefix + latest["checkpoint"], store, step, owner), True
    else:
        final = local[0]
    for key, path in ((HOST_WORKER_LOG_FILE, files.log), (EVENTS_FILE, files.events)):
        if (force and not have_ckpt) or not _has_content(path):   # SEQ and the event history continue
            changed = _download(s3, bucket, prefix + key, path, owner) or changed
    return {"changed": changed, "step": step if not have_ckpt else local_step, "checkpoint": final, "url": url}


def _download_checkpoint(s3, bucket, base, store, step, owner):
    """Download into a hidden temp dir and rename it into place (CheckpointStore.write's convention)."""
    leaves = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=base):
        leaves += [o["Key"][len(base):] for o in page.get("Contents", [])]
    if META not in leaves:
        raise RuntimeError(f"s3://{bucket}/{base} has no meta.json: not a complete checkpoint, refusing it")
    if any(part in ("", ".", "..") for leaf in leaves for part in leaf.split("/")):
        raise RuntimeError(f"s3://{bucket}/{base} holds odd keys ('', '.', '..' parts): not a checkpoint of this runtime")
    tmp = tempfile.mkdtemp(prefix=f".tmp-{CKPT_PREFIX}{step:010d}-", dir=store.directory)
    try:
        for leaf in sorted(leaves, key=lambda n: n == META):    # meta.json last
            if "/" in leaf:                                     # a nested file of the payload
                os.makedirs(os.path.join(tmp, os.path.dirname(leaf)), mode=0o755, exist_ok=True)
            if not _download(s3, bucket, base + leaf, os.path.join(tmp, *leaf.split("/")), owner):
                raise RuntimeError(f"s3://{bucket}/{base}{leaf} vanished while restoring (pruned?): run it again")
        with open(os.path.join(tmp, META)) as handle:
            meta = json.load(handle)
        if meta.get("step", step) != step:
            raise RuntimeError(f"s3://{bucket}/{base}meta.json is not of step {step}, as LATEST.json says")
        try:
            verify(tmp, meta)         # every file as meta.json's digests say, before it can be resumed from
        except CheckpointError as exc:
            raise RuntimeError(f"s3://{bucket}/{base} is damaged ({exc}): refusing it; resume from an older "
                               f"checkpoint (resume_from=s3://{bucket}/<prefix>/ of another job) or a local one")
        for sub, _dirs, _names in os.walk(tmp):     # nested payload directories: the owner's too
            if sub != tmp:
                _chown(sub, owner)
        fsync_directory(tmp)
        os.chmod(tmp, 0o755)
        _chown(tmp, owner)
        os.rename(tmp, store.path_for(step))
        fsync_directory(store.directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return store.path_for(step)


# ---------------------------------------------------------------------- command lines
def _common(prog, doc):
    ap = argparse.ArgumentParser(prog=prog, description=doc)
    ap.add_argument("--efs", default=os.environ.get("EFS_MOUNT"), required="EFS_MOUNT" not in os.environ,
                    help="the job's shared volume [$EFS_MOUNT]")
    ap.add_argument("--url", required=True, help="s3://<bucket>/<cluster>/<job>/")
    ap.add_argument("--checkpoint-dir", default=None, help="[<efs>/checkpoints]")
    return ap


def sync_main(argv=None):
    ap = _common("dt-checkpoint-sync", "Copy the job's committed checkpoints and files to S3.")
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between passes [%(default)s]")
    ap.add_argument("--keep", type=int, default=2, help="checkpoints kept in S3 [%(default)s]")
    ap.add_argument("--once", action="store_true", help="one pass; exit 1 if it failed")
    ap.add_argument("--stop-grace", type=float, default=20.0,
                    help="seconds for the last pass after SIGTERM [%(default)s]")
    args = ap.parse_args(argv)
    try:
        if not os.path.isdir(args.efs):       # not mounted yet: never write the job onto the root disk
            raise UserError(f"{args.efs} is not a directory: mount the shared volume first")
        sync = Sync(args.efs, args.url, keep=args.keep, checkpoint_dir=args.checkpoint_dir)
    except UserError as exc:
        print(f"dt-checkpoint-sync: {exc}", file=sys.stderr)
        return 2
    return sync.run(interval=max(0.1, args.interval), once=args.once, grace=args.stop_grace)


def restore_main(argv=None):
    ap = _common("dt-checkpoint-restore", "Restore a job's latest checkpoint and log from S3 onto a fresh volume.")
    ap.add_argument("--force", action="store_true", help="restore over a volume that holds another job's log")
    ap.add_argument("--owner", default=None, help="user[:group] to own what is written (when run as root)")
    args = ap.parse_args(argv)
    try:
        owner = parse_owner(args.owner) if args.owner else None
        result = restore(args.efs, args.url, args.checkpoint_dir, force=args.force, owner=owner)
    except UserError as exc:
        print(f"dt-checkpoint-restore: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:            # noqa: BLE001 - one line, not a traceback, for the playbook
        print(f"dt-checkpoint-restore: {explain(exc, args.url) if error_code(exc) else exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, sort_keys=True))
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"sync": sync_main, "restore": restore_main}
    if not argv or argv[0] not in commands:
        print("usage: python -m dynatrain_runtime.daemons.s3sync {sync|restore} ...", file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
