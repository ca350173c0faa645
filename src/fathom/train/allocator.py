"""CPU allocator tuning: keep large freed blocks in the heap between steps.

PyTorch has no caching allocator on the CPU. With glibc's defaults, the large gradient and
activation buffers of each step are ``mmap``-ed and ``munmap``-ed again (the dynamic mmap
threshold only adapts to sizes it has seen freed), so every step pays page faults for
tens of megabytes. Stochastic depth makes it worse: the set of buffer sizes changes from
step to step with the branch topology. A high trim threshold and a large top pad keep
freed memory in the heap instead of returning it to the OS after every step. Numerics are unchanged; measured effect in ``BENCHMARKS.md``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
TRIM_THRESHOLD = 2**30  # never give the top of the heap back between steps
TOP_PAD = 2**29  # grow the heap in large steps (fewer brk calls and page-fault storms)


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
    ok_trim = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    ok_pad = mallopt(M_TOP_PAD, TOP_PAD) == 1
    return ok_trim and ok_pad
