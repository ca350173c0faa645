"""CPU allocator tuning: keep large freed blocks in the heap between steps.

PyTorch has no caching allocator on the CPU. With glibc's defaults, the large gradient and
activation buffers of each step are ``mmap``-ed and ``munmap``-ed again (the dynamic mmap
threshold only adapts to sizes it has seen freed), so every step pays page faults for
tens of megabytes. Stochastic depth makes it worse: the set of buffer sizes changes from
step to step with the branch topology, and each new size can move glibc's dynamic mmap
threshold. A fixed mmap threshold at its maximum (32 MiB on 64-bit glibc; this also stops the
dynamic adjustment), a high trim threshold and a large top pad keep freed memory in the heap
instead of returning it to the OS after every step. Numerics are unchanged; measured effect in
``BENCHMARKS.md``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_TRIM_THRESHOLD = 2**30  # never give the top of the heap back between steps
_TOP_PAD = 2**29  # grow the heap in large steps (fewer brk calls and page-fault storms)
_MMAP_THRESHOLD = 2**25  # glibc's maximum on 64-bit (HEAP_MAX_SIZE / 2): larger blocks still mmap


@functools.cache
def tune_cpu_allocator() -> bool:
    """Apply the thresholds once per process; ``False`` where glibc's ``mallopt`` is absent."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok_trim = mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD) == 1
    ok_pad = mallopt(_M_TOP_PAD, _TOP_PAD) == 1
    ok_mmap = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD) == 1
    return ok_trim and ok_pad and ok_mmap
