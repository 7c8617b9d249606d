"""Fault hooks of the chaos campaign, loaded into every process of a campaign job.

``tests/chaos/campaign.py`` puts this directory first on ``PYTHONPATH`` of the launcher it
starts; the launcher's children (child wrappers, workers, servers) inherit it, so Python
imports this ``sitecustomize`` at start-up in each of them.  It does nothing unless
``DT_CHAOS_DIR`` is set, and nothing to the product's logic unless the campaign drops a
trigger file in that directory:

``clock_offset``   (float seconds; only with ``DT_CHAOS_CLOCK=1``) ``time.time`` and
                   ``time.time_ns`` of the launcher and of the processes of the hosts named in
                   ``DT_CHAOS_CLOCK_HOSTS`` jump by that offset (a clock step on the master:
                   NTP stepping, a VM resumed).  ``time.monotonic`` is left alone.
``ckpt_delay``     (float seconds) a worker writing a checkpoint (``CheckpointStore.write``) pauses
                   that long after the payload (params, trainer states) and before ``meta.json``
                   and the rename, with ``ckpt_writing.<pid>`` (JSON: pid, ip, step) present
                   meanwhile: the campaign kills the launcher or the writer right there.
``append_tear``    (consumed by the first append) the launcher's next ``host_worker_log`` append
                   (``shared_volume.append_log``) writes half of its line, fsyncs it, creates
                   ``appending.<pid>`` and waits 60 s: the campaign SIGKILLs the launcher there,
                   leaving a torn last line as a crash mid-append does.

``dt_line``        (consumed by the first taker; only with ``DT_CHAOS_DT_LINE_HOSTS`` naming the host)
                   a training process (a worker of ``train_digits``) of that host writes each line of
                   the file on its stdout as an ``@@DT`` message: a hostile or broken worker's line,
                   read by the launcher as any other.

The hooks wrap the product's functions (post-import), never replace their logic: whatever
``append_log`` or ``CheckpointStore.write`` do once fixed, they still run.  A hook whose
target is gone (renamed) is skipped; the campaign then reports the fault as not injected.
"""

import importlib.abc
import json
import os
import sys
import time

_CHAOS = os.environ.get("DT_CHAOS_DIR")


def _read(name):
    try:
        with open(os.path.join(_CHAOS, name)) as handle:
            return handle.read().strip()
    except OSError:
        return None


def _float(name):
    text = _read(name)
    try:
        return float(text) if text else 0.0
    except ValueError:
        return 0.0


def _mark(name, info):
    path = os.path.join(_CHAOS, name)
    with open(path + ".tmp", "w") as handle:
        json.dump(info, handle)
    os.rename(path + ".tmp", path)


def _unlink(name):
    try:
        os.unlink(os.path.join(_CHAOS, name))
        return True
    except OSError:
        return False


# ---------------------------------------------------------------- clock step
def _install_clock():
    hosts = set(filter(None, os.environ.get("DT_CHAOS_CLOCK_HOSTS", "").split(",")))
    ip = os.environ.get("DT_WORKER_IP")
    if ip is not None and ip not in hosts:     # another "machine": its clock does not step
        return
    real_time, real_ns, mono = time.time, time.time_ns, time.monotonic
    state = {"offset": 0.0, "checked": -1.0}

    def offset():
        now = mono()
        if now - state["checked"] >= 0.05:
            state["checked"] = now
            state["offset"] = _float("clock_offset")
        return state["offset"]

    def stepped_time():
        return real_time() + offset()

    def stepped_time_ns():
        return real_ns() + int(offset() * 1e9)

    time.time = stepped_time
    time.time_ns = stepped_time_ns


# ---------------------------------------------------------------- checkpoint pause
def _patch_checkpoint(mod):
    store = getattr(mod, "CheckpointStore", None)
    orig = getattr(store, "write", None)
    if orig is None:
        return

    def write(self, step, meta, write_files=None, *args, **kwargs):
        delay = _float("ckpt_delay")
        if not delay or not os.environ.get("DT_WORKER_IP"):
            return orig(self, step, meta, write_files, *args, **kwargs)

        def payload(tmp):
            if write_files is not None:
                write_files(tmp)
            name = "ckpt_writing.%d" % os.getpid()
            _mark(name, {"pid": os.getpid(), "ip": os.environ.get("DT_WORKER_IP"), "step": int(step),
                         "tmp": tmp, "time": time.time()})
            try:
                time.sleep(delay)
            finally:
                _unlink(name)

        return orig(self, step, meta, payload, *args, **kwargs)

    store.write = write


# ---------------------------------------------------------------- torn append
class _TearingFile(object):
    """A file (text or binary) whose first write() writes half, fsyncs, and waits to be killed."""

    def __init__(self, handle):
        self._handle = handle

    def write(self, data):
        newline = b"\n" if isinstance(data, (bytes, bytearray)) else "\n"
        half = max(1, len(data.rstrip(newline)) // 2)
        self._handle.write(data[:half])
        self._handle.flush()
        os.fsync(self._handle.fileno())

        def text(value):
            return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value

        _mark("appending.%d" % os.getpid(), {"pid": os.getpid(), "written": text(data[:half]), "line": text(data)})
        time.sleep(60)                 # the campaign SIGKILLs us here
        return self._handle.write(data[half:]) + half

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._handle.__exit__(*exc)


class _TearingOs(object):
    """``os`` for shared_volume during one append: a file opened for appending (``os.fdopen(fd, "a...")``)
    tears its first write; everything else is the real ``os``."""

    def __init__(self, real):
        self._real = real

    def fdopen(self, fd, mode="r", *args, **kwargs):
        handle = self._real.fdopen(fd, mode, *args, **kwargs)
        return _TearingFile(handle) if "a" in mode else handle

    def __getattr__(self, name):
        return getattr(self._real, name)


def _patch_shared_volume(mod):
    orig = getattr(mod, "append_log", None)
    if orig is None:
        return
    import builtins

    def append_log(log_path, *args, **kwargs):
        if not _unlink("append_tear"):
            return orig(log_path, *args, **kwargs)
        target = os.path.abspath(log_path)

        def tearing_open(file, mode="r", *a, **kw):
            handle = builtins.open(file, mode, *a, **kw)
            if "a" in mode and isinstance(file, str) and os.path.abspath(file) == target:
                return _TearingFile(handle)
            return handle

        real_os = mod.os
        mod.open = tearing_open        # module global: shadows the builtin inside shared_volume only
        mod.os = _TearingOs(real_os)   # the same for os.fdopen of the descriptor open_nofollow gave (issue 40)
        try:
            return orig(log_path, *args, **kwargs)
        finally:
            del mod.open
            mod.os = real_os

    mod.append_log = append_log


_PATCHES = {"dynatrain_runtime.contract.checkpoint": _patch_checkpoint,
            "dynatrain_runtime.contract.shared_volume": _patch_shared_volume}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, patch):
        self.inner, self.patch = inner, patch

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        try:
            self.patch(module)
        except Exception as exc:       # noqa: BLE001 - a hook must never break the product
            sys.stderr.write("chaos shim: cannot patch %s: %s\n" % (module.__name__, exc))


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, patch)
                return spec
        return None


# ---------------------------------------------------------------- a worker's own @@DT line
def _install_dt_line():
    hosts = set(filter(None, os.environ.get("DT_CHAOS_DT_LINE_HOSTS", "").split(",")))
    if os.environ.get("DT_WORKER_IP") not in hosts or os.environ.get("DMLC_ROLE", "worker") != "worker":
        return
    import threading

    def watch():
        while True:
            time.sleep(0.1)
            first = str((getattr(sys, "argv", None) or [""])[0])
            if first in ("", "-m", "-c"):            # still starting (runpy sets argv[0] to the module's file)
                continue
            if "train_digits" not in os.path.basename(first):      # a wrapper or a server, not the training
                return
            text = _read("dt_line")
            if text and _unlink("dt_line"):
                for line in text.splitlines():
                    os.write(1, ("@@DT " + line + "\n").encode())     # as protocol.emit writes it

    threading.Thread(target=watch, name="chaos-dt-line", daemon=True).start()


if _CHAOS:
    if os.environ.get("DT_CHAOS_CLOCK") == "1":
        _install_clock()
    if os.environ.get("DT_CHAOS_DT_LINE_HOSTS"):
        _install_dt_line()
    sys.meta_path.insert(0, _Finder())
