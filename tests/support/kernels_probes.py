"""Small Triton kernels around the selection's device functions, for the kernel tests (imported on first use:
needs triton)."""

import triton
import triton.language as tl

from locks_kernels.select import SEARCH_ARITY, SEARCH_ROUNDS, _take_top  # noqa: F401 (re-exported for the tests)


@triton.jit
def take_top_probe(keys_ptr, take_ptr, slot_ptr, K, N: tl.constexpr, NT: tl.constexpr, ROUNDS: tl.constexpr):
    """One program: ``take[i]`` (1 for the ``K`` largest keys ``>= 1`` of ``keys [N]``) and their slots."""
    o = tl.arange(0, N)
    take, slot, _ = _take_top(tl.load(keys_ptr + o), K, NT, ROUNDS)
    tl.store(take_ptr + o, take.to(tl.int32))
    tl.store(slot_ptr + o, slot, mask=take)
