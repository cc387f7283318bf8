"""Batched symmetric eigensolver for small matrices (``N x N``, ``N`` a power of two, e.g. the 16 x 16 page Gram).

Parallel cyclic Jacobi: a sweep is ``N - 1`` rounds of the round-robin (circle) schedule, each round applying
``N / 2`` disjoint plane rotations at once as ``A <- J^T A J``, ``U <- U J`` (Golub & Van Loan, *Matrix
Computations*, 4th ed., Section 8.5.5 "parallel Jacobi"; Brent & Luk 1985). Everything stays in registers, the
loop count is bounded and there is no host synchronization, so it is safe inside a CUDA graph
(``torch.linalg.eigh`` synchronizes with the host).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _round_partner(idx, r, N: tl.constexpr):
    """Partner of each index in round ``r`` of the circle schedule (index ``N - 1`` is the fixed player)."""
    partner = (2 * r - idx + 2 * (N - 1)) % (N - 1)
    partner = tl.where(idx == r, N - 1, partner)
    return tl.where(idx == N - 1, r, partner)


@triton.jit
def _offdiag_energy(A, eye):
    return tl.sum(tl.sum(tl.where(eye, 0.0, A * A), axis=1), axis=0)


@triton.jit
def _rotate_by_products(A, U, idx, eye, partner, first):
    """One round's rotations as products with the rotation matrix ``J`` `[N, N]`: ``A <- J^T A J``, ``U <- U J``
    (three ``N x N x N`` fp32 products and their operand layouts)."""
    cols = idx[None, :]
    is_partner = cols == partner[:, None]  # [N, N], one per row
    d = tl.sum(tl.where(eye, A, 0.0), axis=1)
    # both rows of a pair must see the same A[p, q] (A drifts from symmetry by rounding)
    a_ip = tl.sum(tl.where(is_partner, A, 0.0), axis=1)
    a_ip = 0.5 * (a_ip + tl.sum(tl.where(is_partner, tl.trans(A), 0.0), axis=1))  # A[i, partner(i)]
    d_p = tl.sum(tl.where(is_partner, d[None, :], 0.0), axis=1)  # A[partner(i), partner(i)]
    c, s = _schur(d, d_p, a_ip, first)
    J = tl.where(eye, c[:, None], 0.0) + tl.where(is_partner, s[:, None], 0.0)
    A = tl.dot(tl.trans(J), tl.dot(A, J, input_precision="ieee"), input_precision="ieee")
    U = tl.dot(U, J, input_precision="ieee")
    return A, U


@triton.jit
def _rotate_by_gathers(A, U, idx, eye, partner, first, N: tl.constexpr):
    """The same round elementwise: ``J`` is ``c`` on the diagonal and ``s_i`` at ``(i, partner(i))`` with
    ``s_partner(i) = -s_i``, so ``(A J)[i, j] = c_j A[i, j] - s_j A[i, p(j)]`` and ``(J^T M)[i, j] = c_i M[i, j]
    - s_i M[p(i), j]``: the partner's row or column by ``tl.gather``, ``O(N^2)`` work instead of ``O(N^3)``."""
    cols_p = tl.broadcast_to(partner[None, :], (N, N))  # [i, j] -> p(j)
    rows_p = tl.broadcast_to(partner[:, None], (N, N))  # [i, j] -> p(i)
    A_pc = tl.gather(A, cols_p, axis=1)  # A[i, p(j)]
    d = tl.sum(tl.where(eye, A, 0.0), axis=1)
    a_ip = tl.sum(tl.where(eye, A_pc, 0.0), axis=1)  # A[i, p(i)]
    # both rows of a pair must see the same A[p, q] (A drifts from symmetry by rounding)
    a_ip = 0.5 * (a_ip + tl.gather(a_ip, partner, axis=0))
    d_p = tl.gather(d, partner, axis=0)
    c, s = _schur(d, d_p, a_ip, first)
    M = A * c[None, :] - A_pc * s[None, :]
    A = M * c[:, None] - tl.gather(M, rows_p, axis=0) * s[:, None]
    U = U * c[None, :] - tl.gather(U, cols_p, axis=1) * s[None, :]
    return A, U


@triton.jit
def _schur(d, d_p, a_ip, first):
    """Cosine and signed sine of the symmetric Schur rotation zeroing ``A[p, q]`` of each pair, per index (Golub
    & Van Loan, Algorithm 8.5.1): ``s`` is ``+t c`` at the pair's first index and ``-t c`` at its second."""
    a_pp = tl.where(first, d, d_p)
    a_qq = tl.where(first, d_p, d)
    tau = (a_qq - a_pp) / (2.0 * tl.where(a_ip == 0.0, 1.0, a_ip))
    t = tl.where(tau >= 0.0, 1.0, -1.0) / (tl.abs(tau) + tl.sqrt(1.0 + tau * tau))
    t = tl.where(a_ip == 0.0, 0.0, t)
    c = 1.0 / tl.sqrt(1.0 + t * t)
    return c, tl.where(first, t * c, -t * c)


@triton.jit
def jacobi_eigh(A, N: tl.constexpr, MAX_SWEEPS: tl.constexpr, TOL: tl.constexpr, GATHER: tl.constexpr = True):
    """Eigen-decompose a symmetric fp32 ``A`` `[N, N]`: returns ``(lam [N], U [N, N])``, ``A = U diag(lam) U^T``,
    eigenvalues unordered. Stops when the off-diagonal energy is below ``TOL`` of the total (``1e-12``: fp32
    rounding) or after ``MAX_SWEEPS`` sweeps. ``GATHER``: each round's rotations elementwise with the partners'
    rows and columns gathered (``_rotate_by_gathers``), else as matrix products (``_rotate_by_products``)."""
    idx = tl.arange(0, N)
    eye = idx[:, None] == idx[None, :]
    U = tl.where(eye, 1.0, 0.0)
    total = tl.sum(tl.sum(A * A, axis=1), axis=0)
    off = _offdiag_energy(A, eye)
    sweep = 0
    while (sweep < MAX_SWEEPS) & (off > TOL * total):
        for r in range(N - 1):
            partner = _round_partner(idx, r, N)
            first = idx < partner
            if GATHER:
                A, U = _rotate_by_gathers(A, U, idx, eye, partner, first, N)
            else:
                A, U = _rotate_by_products(A, U, idx, eye, partner, first)
        A = 0.5 * (A + tl.trans(A))
        off = _offdiag_energy(A, eye)
        sweep += 1
    lam = tl.sum(tl.where(eye, A, 0.0), axis=1)
    return lam, U


@triton.jit
def sort_eigh_desc(lam, U, N: tl.constexpr):
    """Reorder eigenpairs by descending eigenvalue (ties by index): ``(lam [N], U [N, N])``, columns of ``U``."""
    idx = tl.arange(0, N)
    before = (lam[None, :] > lam[:, None]) | ((lam[None, :] == lam[:, None]) & (idx[None, :] < idx[:, None]))
    rank = tl.sum(before.to(tl.int32), axis=1)  # [N]: position of eigenpair i
    perm = idx[:, None] == rank[None, :]  # [N, N]: perm[k, i] = eigenpair i goes to slot k
    lam_sorted = tl.sum(tl.where(perm, lam[None, :], 0.0), axis=1)
    U_sorted = tl.dot(U, tl.trans(tl.where(perm, 1.0, 0.0)), input_precision="ieee")
    return lam_sorted, U_sorted


@triton.jit
def _eigh_kernel(a_ptr, lam_ptr, u_ptr, N: tl.constexpr, MAX_SWEEPS: tl.constexpr, GATHER: tl.constexpr):
    i_n = tl.program_id(0).to(tl.int64)
    idx = tl.arange(0, N)
    offs = i_n * N * N + idx[:, None] * N + idx[None, :]
    A = tl.load(a_ptr + offs)
    lam, U = jacobi_eigh(A, N, MAX_SWEEPS, 1e-12, GATHER)
    lam, U = sort_eigh_desc(lam, U, N)
    tl.store(lam_ptr + i_n * N + idx, lam)
    tl.store(u_ptr + offs, U)


def _eigh_fwd(a: Tensor, max_sweeps: int, gather: bool) -> tuple[Tensor, Tensor]:
    n = a.shape[-1]
    assert a.dim() == 3 and a.shape[1] == n, f"expected [M, N, N], got {list(a.shape)}"
    assert n >= 16 and n & (n - 1) == 0, f"N must be a power of two >= 16, got {n}"
    a = a.float().contiguous()
    lam = torch.empty(a.shape[:2], dtype=torch.float32, device=a.device)
    u = torch.empty_like(a)
    _eigh_kernel[(a.shape[0],)](
        a,
        lam,
        u,
        N=n,
        MAX_SWEEPS=max_sweeps,
        GATHER=gather,
        num_warps=2,
    )
    return lam, u


def batched_eigh(a: Tensor, max_sweeps: int = 10, gather: bool = True) -> tuple[Tensor, Tensor]:
    """Eigenvalues and eigenvectors of a batch of symmetric matrices, on the device, without host sync.

    Args:
        a (Tensor): symmetric matrices of shape `[M, N, N]`, ``N`` a power of two >= 16; computed in fp32.
        max_sweeps (int): bound on Jacobi sweeps (a 16 x 16 fp32 matrix converges in about 5-7).
        gather (bool): rotations elementwise with gathered partners (else as matrix products; tuning only).
    Returns:
        tuple: ``lam`` `[M, N]` fp32 in descending order and ``u`` `[M, N, N]` fp32 whose columns are the
        eigenvectors (``a = u diag(lam) u^T``); signs are arbitrary, as with ``torch.linalg.eigh``.
    Raises:
        AssertionError: on a shape that is not `[M, N, N]` with ``N`` a power of two >= 16.
    """
    return _eigh_fwd(a, max_sweeps, gather)
