"""reuse_freed_memory(): a big tensor allocated again after being freed costs no new page faults,
and the heap stops growing once it holds the working set.

Run in a fresh interpreter each time, so the test process's own allocator settings do not matter.
"""

import json

import pytest

from tests import launch

BLOCK_MB = 64  # above glibc's largest dynamic mmap threshold (32 MiB): mapped afresh on every allocation
PROBE = f"""
import json, resource, sys
import psutil, torch
torch.set_num_threads(1)
if sys.argv[1] == "tuned":
    from sf_core.contracts.component import reuse_freed_memory
    reuse_freed_memory()
faults, rss = [], []
for _ in range(20):  # like a training loop: the same big batch, plus smaller temporaries, again and again
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    batch = torch.empty({BLOCK_MB} * 2**20 // 4).fill_(1.0)
    other = torch.empty(3 * 2**20 // 4).fill_(1.0)
    del batch, other
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    rss.append(psutil.Process().memory_info().rss / 2**20)
print(json.dumps({{"faults": faults, "rss_mb": rss}}))
"""


def probe(mode: str) -> dict:
    out = launch.run([mode], timeout=120, code=PROBE)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.slow
def test_a_freed_batch_is_reused_without_page_faults():
    pages = BLOCK_MB * 2**20 // 4096
    default, tuned = probe("default"), probe("tuned")
    # glibc's default: unmapped on free, every page faulted again on the next allocation
    assert min(default["faults"][-5:]) > pages // 2, default["faults"]
    # tuned: after a few iterations the heap holds the block and hands it out again
    assert max(tuned["faults"][-5:]) < pages // 20, tuned["faults"]
    assert tuned["rss_mb"][-1] - tuned["rss_mb"][9] < BLOCK_MB / 4, tuned["rss_mb"]  # no longer growing
