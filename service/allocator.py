"""glibc malloc settings for bulk translations: large buffers reused, not mapped afresh.

glibc serves an allocation above its mmap threshold (128 KiB at first, raised as large
blocks are freed, up to 32 MiB) with a fresh ``mmap`` and returns it with ``munmap`` when
freed, and it gives free memory at the top of a heap back to the system above its trim
threshold (by default twice the adaptive mmap threshold). A bulk translate request
allocates several buffers of its body's size (the body, the input matrix, the stitch's
intermediate tensors, the answer), and a few requests are in flight at once, so the freed
memory was returned and the next requests paid a page fault per 4 KiB page of it again.
With the mmap threshold fixed at 32 MiB and a trim threshold of 128 MiB, those buffers come
from the heap and are reused (``tests/service/test_allocator.py``: 40,704 page faults for
20 rounds of four 12 MiB buffers with glibc's defaults, 0 tuned).

Measured (``bench/throughput.py``'s ridge 384→384 stitch, Arrow, batch 8,192, 4 clients on
this 2-core machine, alternating rounds): 208-229k vectors/s without, 261-281k with
(+15-25 %); base64 batches of 1,024 (2 MB bodies, mostly under the adaptive threshold
already) are unchanged. The cost is memory kept by the process after a burst of bulk
requests: at most about the trim threshold above what is in use.

Only glibc has ``mallopt``; elsewhere (musl, macOS) nothing is changed.
"""

from __future__ import annotations

import ctypes
import logging
import platform

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "tune_malloc"]

logger = logging.getLogger("lead.service")

#: glibc's ``M_TRIM_THRESHOLD`` and ``M_MMAP_THRESHOLD`` (``malloc.h``).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: The largest value glibc's adaptive mmap threshold reaches on 64-bit systems.
MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 128 * 1024 * 1024


def tune_malloc(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> bool:
    """Set glibc's mmap and trim thresholds for this process (see the module docstring).

    Parameters
    ----------
    mmap_threshold : int
        Bytes; allocations of this size or more get their own mapping.
    trim_threshold : int
        Bytes of free memory at the top of the heap beyond which it is returned.

    Returns
    -------
    bool
        True when both were set; False when the C library is not glibc or ``mallopt``
        refused a value (logged; the service runs on with glibc's defaults).
    """
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done: bool = mallopt(_M_MMAP_THRESHOLD, mmap_threshold) == 1
    done = mallopt(_M_TRIM_THRESHOLD, trim_threshold) == 1 and done
    if not done:
        logger.warning("glibc refused the malloc thresholds; keeping its defaults")
    return done
