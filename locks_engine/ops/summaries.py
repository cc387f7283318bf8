"""Page summaries: centroid, page-local rank-r key basis and per-token coefficients (paper Section 3.1).

For page ``j`` and KV head ``h`` with keys ``K_j`` of shape `[B, D]`: centroid ``mu = mean_i k_i``; centered
keys ``K_c = K_j - mu``; the top-``r`` eigenvectors ``V`` (`[r, D]`) of ``K_c^T K_c``, found through the
``B x B`` Gram matrix ``K_c K_c^T = U diag(lam) U^T`` as ``V = diag(lam)^-1/2 U^T K_c`` (``B < D``);
coefficients ``c_i = V (k_i - mu)`` (`[B, r]`). Keys are reconstructed as ``mu + V^T c_i``.

Storage formats (``LocksConfig.summary_format``; scales fp16):

- ``float``: fp32 centroid `[D]`, basis `[r, D]`, coefficients `[B, r]` (reference; no rounding).
- ``paper``: int8 centroid, int4 basis packed two per byte, int8 coefficients, one scale per tensor per page
  and head (the paper's format: about 9.5% of bf16 K+V at B=16, r=8, D=128; 11.1% at D=64).
- ``colwise``: fp16 centroid, int4 basis and int8 coefficients with one scale per basis direction. Real keys
  have large near-constant channels (centroid entries up to ~145) that one int8 scale per centroid cannot hold
  together with the small ones, and a single int4 scale wipes out a direction's small entries
  (``../shared/DESIGN.md``, "Quantization needs care").
- ``chanlog``: as ``colwise``, but the int4 basis has one scale per channel (head-dim coordinate
  ``d``, shared by the ``r`` directions) stored as a 1-byte log2 code, ``scale_d = 2 ** (code_d / 4)``, rounded
  up so that no entry clips. Real keys' channels differ in size by orders of magnitude and every direction mixes
  them: a scale per channel keeps the small channels that a scale per direction, set by the large ones, rounds
  to zero (measured on Qwen2.5-Coder-0.5B, 32K tokens, 2% budget, r=8: worst layer 0.965 of the
  oracle's mass against 0.940 for ``colwise``; ``samples/BENCHMARKS.md``). About 12.7% of bf16 K+V at B=16,
  r=8, D=128 (1,040 B against 928 B), 14.5% at D=64.
- ``colwise8`` (the default): as ``colwise``, but an int8 basis (one fp16 scale per direction). Keeps the small
  channels as ``chanlog`` does and more (32K tokens, 2%, r=8: worst layer 0.969 against chanlog's 0.965), and its scores
  need no int4 unpacking or per-channel scale: the GPU kernel takes the int8 basis straight into the int8
  matrix units (``kernels/NOTES.md``).
  About 17.6% of bf16 K+V at B=16, r=8, D=128 (1,440 B), 19.5% at D=64 (800 B).

- ``quest``, ``quest2``, ``quest4``: not LOCKS' summary but Quest's (Tang et al., ICML 2024, Section 3), the
  baseline run through the same backend: the fp16 channel minimum and maximum `[n, D]` of the keys of each page
  (``n = 1``) or of each of its ``n = 2`` or ``4`` equal chunks (:class:`QuestSummaries`; scored by
  ``ops.baselines.quest_scores``). ``4 n D`` bytes: 256, 512, 1,024 B at D=64 (LOCKS' ``colwise8``: 800 B).

In the quantized formats the coefficients are fitted to the *stored* centroid and basis (least squares
against the dequantized basis), so rounding of the basis is partly absorbed by the coefficients.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor

from locks_engine.config import LocksConfig, quest_chunks
from locks_engine.ops.paging import complete_page_mask, gather_pages, pages_per_block, physical_page_ids
from locks_engine.ops.quant import (
    dequantize, log2_scale, pack_int4, quantize_log2_scale, quantize_symmetric, unpack_int4,
)


@dataclass
class PageSummaries:
    """Summaries of pages, indexed by page id along the first dim (physical page id in a store)."""

    summary_format: str
    """One of ``locks_engine.config.SUMMARY_FORMATS``."""
    centroid: Tensor
    """`[P, H, D]`: fp32 (float), int8 (paper) or fp16 (colwise, chanlog, colwise8)."""
    basis: Tensor
    """`[P, H, r, D]` fp32 (float), `[P, H, r, D]` int8 (colwise8) or `[P, H, r, D // 2]` uint8 int4 pairs;
    row ``k`` is direction ``k``."""
    coeffs: Tensor
    """`[P, H, B, r]`: fp32 (float) or int8."""
    centroid_scale: Tensor | None = None
    """`[P, H, 1]` fp16 (paper only)."""
    basis_scale: Tensor | None = None
    """`[P, H, 1, 1]` fp16 (paper), `[P, H, r, 1]` fp16 (colwise, colwise8) or `[P, H, 1, D]` int8 log2 codes
    (chanlog: ``scale = 2 ** (code / 4)``, ``ops.quant.log2_scale``)."""
    coeffs_scale: Tensor | None = None
    """`[P, H, 1, 1]` fp16 (paper) or `[P, H, 1, r]` (colwise, chanlog, colwise8)."""

    def tensors(self) -> dict[str, Tensor]:
        """The stored tensors by field name (scales that the format lacks are left out)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), Tensor)}

    def colwise8(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """The tensors as the GPU kernels take them (``locks_kernels``), the same storage, no copy:
        ``(centroid [P, H, D] fp16, basis [P, H, r, D] int8, coeffs [P, H, B, r] int8, basis_scale [P, H, r, 1]
        fp16, coeffs_scale [P, H, 1, r] fp16)``.

        Raises:
            ValueError: when the summaries are in another format (the kernels take ``colwise8`` only).
        """
        if self.summary_format != "colwise8":
            raise ValueError(f"summary_format={self.summary_format!r}: the GPU kernels take 'colwise8' summaries only")
        return self.centroid, self.basis, self.coeffs, self.basis_scale, self.coeffs_scale

    @property
    def num_pages(self) -> int:
        return self.centroid.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes of every stored tensor, as allocated."""
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def index(self, page_ids: Tensor) -> "PageSummaries":
        """Summaries of ``page_ids`` (any shape ``[...]``): every tensor gains those leading dims."""
        # index_select over the flat ids: on the CPU 10-40x faster than advanced indexing for these sizes
        flat = page_ids.reshape(-1).long()
        return replace(self, **{
            k: v.index_select(0, flat).view(*page_ids.shape, *v.shape[1:]) for k, v in self.tensors().items()
        })

    def dequantize(self) -> tuple[Tensor, Tensor, Tensor]:
        """fp32 ``(centroid [..., H, D], basis [..., H, r, D], coeffs [..., H, B, r])``."""
        return self.dequantize_centroid(), self.dequantize_basis(), self.dequantize_coeffs()

    def dequantize_centroid(self) -> Tensor:
        """fp32 centroids `[..., H, D]`."""
        if self.summary_format == "paper":
            return dequantize(self.centroid, self.centroid_scale)
        return self.centroid.float()

    def dequantize_basis(self) -> Tensor:
        """fp32 bases `[..., H, r, D]` (the largest tensor of a summary: skip it where the scale can be folded
        into the query, as ``score_pages`` does for ``chanlog``)."""
        if self.summary_format == "float":
            return self.basis.float()
        if self.summary_format == "chanlog":
            return unpack_int4(self.basis).float() * log2_scale(self.basis_scale)
        if self.summary_format == "colwise8":
            return dequantize(self.basis, self.basis_scale)
        return dequantize(unpack_int4(self.basis), self.basis_scale)

    def dequantize_coeffs(self) -> Tensor:
        """fp32 coefficients `[..., H, B, r]`."""
        if self.summary_format == "float":
            return self.coeffs.float()
        return dequantize(self.coeffs, self.coeffs_scale)


@dataclass
class QuestSummaries(PageSummaries):
    """Quest's page summaries (``summary_format`` ``quest``, ``quest2``, ``quest4``): the channel minimum and
    maximum of the keys of each of a page's ``n`` chunks; ``centroid``, ``basis`` and ``coeffs`` are empty
    (`[P, H, 0]`)."""

    key_min: Tensor | None = None
    """`[P, H, n, D]` fp16: chunk ``i`` covers tokens ``[i B / n, (i + 1) B / n)`` of the page."""
    key_max: Tensor | None = None
    """`[P, H, n, D]` fp16."""

    @property
    def chunks(self) -> int:
        """``n``, the chunks a page's bounds cover."""
        return self.key_min.shape[2]


def _layout(cfg: LocksConfig, heads: int, dim: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    r, b = cfg.rank, cfg.page_size
    chunks = quest_chunks(cfg.summary_format)
    if chunks:
        empty = ((heads, 0), torch.float16)
        bounds = ((heads, chunks, dim), torch.float16)
        return {"centroid": empty, "basis": empty, "coeffs": empty, "key_min": bounds, "key_max": bounds}
    if cfg.summary_format == "float":
        return {
            "centroid": ((heads, dim), torch.float32),
            "basis": ((heads, r, dim), torch.float32),
            "coeffs": ((heads, b, r), torch.float32),
        }
    int8_basis = cfg.summary_format == "colwise8"
    if dim % 2 and not int8_basis:
        raise ValueError(f"summary_format={cfg.summary_format!r} packs int4 pairs: head dim {dim} must be even")
    paper, chanlog = cfg.summary_format == "paper", cfg.summary_format == "chanlog"
    layout = {
        "centroid": ((heads, dim), torch.int8 if paper else torch.float16),
        "basis": ((heads, r, dim), torch.int8) if int8_basis else ((heads, r, dim // 2), torch.uint8),
        "coeffs": ((heads, b, r), torch.int8),
        "basis_scale": ((heads, 1, dim), torch.int8) if chanlog else ((heads, 1 if paper else r, 1), torch.float16),
        "coeffs_scale": ((heads, 1, 1 if paper else r), torch.float16),
    }
    if paper:
        layout["centroid_scale"] = ((heads, 1), torch.float16)
    return layout


def allocate_page_summaries(
    num_pages: int, num_kv_heads: int, head_dim: int, cfg: LocksConfig, device: torch.device | str = "cpu"
) -> PageSummaries:
    """A zero-filled store for ``num_pages`` page summaries (zeros dequantize to an all-zero summary).

    Raises:
        ValueError: when an int4 format meets an odd head dim.
    """
    tensors = {
        name: torch.zeros((num_pages, *shape), dtype=dtype, device=device)
        for name, (shape, dtype) in _layout(cfg, num_kv_heads, head_dim).items()
    }
    cls = QuestSummaries if quest_chunks(cfg.summary_format) else PageSummaries
    return cls(summary_format=cfg.summary_format, **tensors)


def write_page_summaries(store: PageSummaries, page_ids: Tensor, new: PageSummaries) -> None:
    """Copy ``new`` (summaries of ``P`` pages) into ``store`` at ``page_ids`` (`[P]`), in place."""
    assert store.summary_format == new.summary_format, "summary formats differ"
    for name, tensor in store.tensors().items():
        tensor.index_copy_(0, page_ids.long(), getattr(new, name))


def _page_basis(centered: Tensor, rank: int) -> Tensor:
    """Top-``rank`` orthonormal directions `[..., r, D]` of centered keys `[..., B, D]` via the Gram matrix.

    Directions with a (numerically) zero eigenvalue are returned as zero rows.
    """
    gram = centered @ centered.transpose(-1, -2)  # [..., B, B]
    lam, u = torch.linalg.eigh(gram)  # ascending
    lam, u = lam.flip(-1)[..., :rank], u.flip(-1)[..., :rank]  # [..., r], [..., B, r]
    keep = lam > 1e-12 * lam[..., :1].clamp_min(1e-300)
    inv_sqrt = torch.where(keep, lam.clamp_min(1e-300).rsqrt(), torch.zeros_like(lam))
    return (u * inv_sqrt.unsqueeze(-2)).transpose(-1, -2) @ centered  # [..., r, D]


def build_page_summaries(keys: Tensor, cfg: LocksConfig) -> PageSummaries:
    """Summarize complete pages of keys (paper Section 3.1, formats in the module docstring).

    Args:
        keys (Tensor): post-RoPE keys of shape `[P, B, H, D]`, any float dtype.
        cfg (LocksConfig): page size ``B``, rank ``r`` and ``summary_format``.
    Returns:
        PageSummaries: ``P`` pages, tensors on ``keys.device``. Computed in fp64 (reference precision).

    Score error of the quantized formats against ``float`` at the same rank: for each page, at most
    ``scale * |q| * max_i |k_hat_i - k_float_i|`` (Cauchy-Schwarz; logsumexp is 1-Lipschitz in the max norm),
    ``k_*`` the two reconstructions; on keys with standard-normal entries and queries of norm ``sqrt(D)``
    (B=16, r=8, D=64 and 128) we measured at most 0.19 nats, and the tests hold both formats to 0.3 nats.
    Raises:
        ValueError: when ``keys.shape[1] != cfg.page_size``, or an int4 format meets an odd head dim.
    """
    if keys.dim() != 4 or keys.shape[1] != cfg.page_size:
        raise ValueError(f"keys must have shape [P, {cfg.page_size}, H, D], got {list(keys.shape)}")
    if quest_chunks(cfg.summary_format):
        return build_quest_summaries(keys, cfg.summary_format)
    k = keys.permute(0, 2, 1, 3).double()  # [P, H, B, D]
    mu = k.mean(dim=2)  # [P, H, D]
    _layout(cfg, k.shape[1], k.shape[3])
    fmt, stored = cfg.summary_format, {}
    if fmt == "paper":
        stored["centroid"], stored["centroid_scale"] = quantize_symmetric(mu, (-1,), 8)
        mu = dequantize(stored["centroid"], stored["centroid_scale"]).double()
    elif fmt != "float":
        stored["centroid"] = mu.to(torch.float16)
        mu = stored["centroid"].double()
    centered = k - mu.unsqueeze(2)  # [P, H, B, D]
    basis = _page_basis(centered, cfg.rank)  # [P, H, r, D]
    if fmt == "float":
        coeffs = centered @ basis.transpose(-1, -2)
        return PageSummaries("float", mu.float(), basis.float(), coeffs.float())
    if fmt == "chanlog":
        basis_q, stored["basis_scale"] = quantize_log2_scale(basis, (-2,), 4)
        basis = basis_q.double() * log2_scale(stored["basis_scale"]).double()
    else:
        bits = 8 if fmt == "colwise8" else 4
        basis_q, stored["basis_scale"] = quantize_symmetric(basis, (-2, -1) if fmt == "paper" else (-1,), bits)
        basis = dequantize(basis_q, stored["basis_scale"]).double()
    stored["basis"] = basis_q if fmt == "colwise8" else pack_int4(basis_q)
    # least squares against the stored basis: c = K_c V^T (V V^T)^+
    gram = basis @ basis.transpose(-1, -2)  # [P, H, r, r]
    coeffs = centered @ basis.transpose(-1, -2) @ torch.linalg.pinv(gram, hermitian=True)
    stored["coeffs"], stored["coeffs_scale"] = quantize_symmetric(coeffs, (-2, -1) if fmt == "paper" else (-2,), 8)
    return PageSummaries(fmt, **stored)


def build_quest_summaries(keys: Tensor, summary_format: str = "quest") -> QuestSummaries:
    """Quest's summaries of complete pages of keys `[P, B, H, D]`: the fp16 channel minimum and maximum of each of
    a page's ``n`` equal chunks (Tang et al., ICML 2024, Section 3; ``n = 1`` is Quest's own page bound).

    Args:
        keys (Tensor): post-RoPE keys `[P, B, H, D]`, any float dtype.
        summary_format (str): ``quest`` (``n = 1``), ``quest2`` or ``quest4``.
    Returns:
        QuestSummaries: ``key_min`` and ``key_max`` `[P, H, n, D]` fp16 on ``keys.device``.
    Raises:
        ValueError: ``summary_format`` is not a Quest format, or ``B`` is not a multiple of ``n``.
    """
    chunks = quest_chunks(summary_format)
    if not chunks:
        raise ValueError(f"summary_format={summary_format!r} is not a Quest format: allowed quest, quest2, quest4")
    pages, size, heads, dim = keys.shape
    if size % chunks:
        raise ValueError(f"{summary_format}: a page of {size} keys does not split into {chunks} equal chunks")
    split = keys.view(pages, chunks, size // chunks, heads, dim)
    empty = keys.new_zeros((pages, heads, 0), dtype=torch.float16)
    return QuestSummaries(
        summary_format, empty, empty, empty,
        key_min=split.amin(dim=2).transpose(1, 2).to(torch.float16).contiguous(),
        key_max=split.amax(dim=2).transpose(1, 2).to(torch.float16).contiguous(),
    )


def build_cache_summaries(
    k_cache: Tensor, block_table: Tensor, seq_lens: Tensor, cfg: LocksConfig, store: PageSummaries | None = None
) -> PageSummaries:
    """Summarize every complete page of every sequence of a paged cache into a store by physical page id.

    Args:
        k_cache (Tensor): `[num_blocks, block_size, H, D]`.
        block_table (Tensor): `[S, max_blocks]`; seq_lens (Tensor): `[S]` tokens.
        store (PageSummaries | None): written in place when given, else allocated for every physical page.
    Returns:
        PageSummaries: the store.
    """
    ppb = pages_per_block(k_cache, cfg.page_size)
    if store is None:
        store = allocate_page_summaries(k_cache.shape[0] * ppb, k_cache.shape[2], k_cache.shape[3], cfg, k_cache.device)
    pages = gather_pages(k_cache, block_table, cfg.page_size)  # [S, Pmax, B, H, D]
    complete = complete_page_mask(seq_lens, pages.shape[1], cfg.page_size)  # [S, Pmax]
    if complete.any():
        ids = physical_page_ids(block_table, ppb)[complete]
        write_page_summaries(store, ids, build_page_summaries(pages[complete], cfg))
    return store


def summary_bytes(
    page_size: int, rank: int, head_dim: int, summary_format: str, kv_dtype: torch.dtype = torch.bfloat16
) -> tuple[int, int]:
    """Bytes of one page's summary and of its K+V, for one KV head, measured from allocated tensors.

    Returns:
        tuple[int, int]: ``(summary_bytes, kv_bytes)``; ``kv_bytes = 2 * B * D * itemsize(kv_dtype)``.
    Raises:
        ValueError: on an invalid combination (see ``LocksConfig``).
    """
    cfg = LocksConfig(page_size=page_size, rank=rank, budget=page_size * 3, summary_format=summary_format)
    store = allocate_page_summaries(1, 1, head_dim, cfg)
    kv = torch.empty((2, page_size, head_dim), dtype=kv_dtype)
    return store.nbytes, kv.numel() * kv.element_size()
