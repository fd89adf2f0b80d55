"""service.allocator: with glibc's thresholds set, bulk-sized buffers are reused from the
heap instead of being mapped (and page-faulted) afresh for every request."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from service.allocator import tune_malloc

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")

# Page faults of 20 rounds of allocating, filling and freeing four 12 MiB buffers at once
# (a few bulk requests' bodies and answers in flight) in a fresh interpreter, with or
# without tune_malloc() first.
_FAULTS = """
import resource, sys
import numpy as np
from service.allocator import tune_malloc
if sys.argv[1] == "tuned":
    assert tune_malloc()
def round():
    buffers = [np.ones(3 << 20, dtype=np.float32) for _ in range(4)]
    return sum(float(b[-1]) for b in buffers)
round()  # first use: faults either way
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    round()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[-1])


def test_thresholds_are_set() -> None:
    assert tune_malloc() is True


def test_bulk_sized_buffers_are_reused_not_faulted_afresh() -> None:
    pages = (12 << 20) // 4096
    plain, tuned = _faults("plain"), _faults("tuned")
    # glibc's defaults: the freed top of the heap (48 MiB) is over the adaptive trim
    # threshold (twice the largest freed mapping: 24 MiB), so it is returned and the
    # next round faults its pages in again (40,704 faults here, against 0 tuned)
    assert plain >= 5 * pages, (plain, tuned)
    assert tuned < pages, (plain, tuned)  # tuned: the heap's pages are reused
