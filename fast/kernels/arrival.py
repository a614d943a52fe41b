"""last_to_arrive: the arrival count that lets the last of a group of programs finish the group's work in the same
launch (the decode split kernel's reduction, linear_add_rmsnorm's add + RMSNorm, the invariant matmul's chunk sum).

It is the semaphore CUTLASS's split-K "serial reduction" uses: a barrier, then one thread's acquire-release
increment of a counter in global memory; the program that sees `arrivals - 1` before its own increment is the last,
puts the counter back to 0 (a CUDA graph replays the launch with the same counter) and passes a barrier so that
none of its threads reads the others' results before the acquire. The others' results must be read from L2
(".cg" loads): a line this SM's L1 holds from before may be stale.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def last_to_arrive(counter_ptr, arrivals):
    """Count this program in at `counter_ptr` (an int32 that starts at 0); True in the last of `arrivals`
    programs, which finds the counter back at 0 for the next launch and every other program's stores visible."""
    tl.debug_barrier()  # every thread's stores precede the count's release
    finished_before = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    is_last = finished_before == arrivals - 1
    if is_last:
        tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
        tl.debug_barrier()  # the acquire precedes every thread's reads of the other programs' results
    return is_last
