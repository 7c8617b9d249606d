"""Denormal floats flushed to zero on the CPU, for the threads a framework starts from here on.

A float32 below ~1.2e-38 (a denormal) costs x86 CPUs a microcode assist per operation: an SGD
update over momentum that decayed into that range (a unit that stopped learning: its momentum
shrinks by the momentum factor every step) ran 25x slower here (0.3 ms -> 8 ms for 151 k
values), and how many such values a run holds depends on its trajectory -- the MXNet conv net's
runs were either near plain's speed or ~40 % below it (``benchmarks/README.md``).  Deep-learning
frameworks flush them (TensorFlow on its threads by default, PyTorch with
``torch.set_flush_denormal``); MXNet 1.9.1 has no switch.  ``flush_denormals`` sets the calling
thread's FTZ and DAZ bits (x86-64 MXCSR, through glibc's ``fegetenv``/``fesetenv``); threads
created afterwards inherit them (POSIX: a new thread inherits the floating-point environment),
so it is called before the framework's first operation starts its engine threads: ``MXNetEngine`` and
the ps-lite servers (``mxnet_serve``), and ``TorchEngine`` before its process group starts gloo's
threads (the same bits ``torch.set_flush_denormal`` sets, on the threads the helper API's workers start).
``DYNATRAIN_FLUSH_DENORMALS=0`` in the job's environment keeps denormals.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import struct

FLAG_VAR = "DYNATRAIN_FLUSH_DENORMALS"
_FTZ, _DAZ = 0x8000, 0x0040        # MXCSR: flush results to zero, treat denormal inputs as zero
_MXCSR_OFFSET, _FENV_SIZE = 28, 32  # glibc's x86-64 fenv_t: the x87 environment, then __mxcsr


def flush_denormals():
    """Flush denormals to zero on this thread and the threads it starts; True when set.

    False (nothing changed) where it does not apply or is turned off: not x86-64 Linux with glibc,
    or ``DYNATRAIN_FLUSH_DENORMALS=0``.
    """
    if os.environ.get(FLAG_VAR, "1") == "0":
        return False
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64") \
            or platform.libc_ver()[0] != "glibc":          # fenv_t's layout below is glibc's
        return False
    _cache_float_limits()
    name = ctypes.util.find_library("m")
    if not name:
        return False
    libm = ctypes.CDLL(name)
    env = ctypes.create_string_buffer(_FENV_SIZE)
    if libm.fegetenv(env) != 0:
        return False
    mxcsr = struct.unpack_from("I", env, _MXCSR_OFFSET)[0]
    struct.pack_into("I", env, _MXCSR_OFFSET, mxcsr | _FTZ | _DAZ)
    return libm.fesetenv(env) == 0


def _cache_float_limits():
    """NumPy computes ``finfo`` once per type, lazily, and warns when DAZ makes its smallest denormal
    read as zero: computed here first, before the bits are set."""
    try:
        import numpy  # noqa: E402 (the frameworks need it; a process without it has no finfo to cache)
    except ImportError:
        return
    for dtype in (numpy.float16, numpy.float32, numpy.float64):
        numpy.finfo(dtype)
