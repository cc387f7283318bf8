"""The LOCKS method in plain PyTorch, stage by stage: the ground truth for the kernels and the CPU path.

Stages (paper, arXiv 2607.24555, Section 3; ``../shared/DESIGN.md``, "The method"):
``build_page_summaries -> score_pages -> select_pages -> sparse_paged_attention``.

Shape vocabulary, used in every docstring of this package and of ``locks_kernels``:

- ``N``  tokens of a sequence; ``S`` sequences in a batch
- ``B``  page size in tokens (``LocksConfig.page_size``); ``P`` pages; ``Pmax`` pages a block table can address
- ``H``  KV heads; ``HQ`` query heads; ``G = HQ / H`` query heads per KV head (query head ``h`` reads KV
  head ``h // G``, as in vLLM)
- ``D``  head dim; ``r`` rank of a page summary; ``K`` pages selected per step (``LocksConfig.budget_pages``)

Paged KV cache, as vLLM lays it out: ``k_cache``/``v_cache`` of shape ``[num_blocks, block_size, H, D]``
(any strides), ``block_table`` ``[S, max_blocks]`` of physical block ids, ``seq_lens`` ``[S]`` in tokens.
A block holds ``ppb = block_size // B`` pages. Logical page ``j`` of sequence ``s`` is tokens
``[j*B, (j+1)*B)``, stored in block ``block_table[s, j // ppb]`` at token offset ``(j % ppb) * B``; its
physical page id, which indexes page summaries, is ``block_table[s, j // ppb] * ppb + j % ppb``.
A page is complete when all its ``B`` tokens are written (``j < seq_len // B``); only complete pages have
summaries, and the incomplete last page is always read.
"""

from locks_engine.ops.attention import attend_selected_pages, dense_paged_attention, sparse_paged_attention
from locks_engine.ops.baselines import (
    SharedBasisSummaries,
    build_shared_basis_summaries,
    fit_shared_basis,
    oracle_scores,
    oracle_scores_by_row,
    quest_scores,
    shared_basis_scores,
    shared_rank_at_equal_bytes,
    window_scores,
)
from locks_engine.ops.metrics import attention_mass_kept
from locks_engine.ops.paging import gather_pages, physical_page_ids
from locks_engine.ops.score import score_pages
from locks_engine.ops.select import select_pages
from locks_engine.ops.summaries import (
    PageSummaries,
    QuestSummaries,
    allocate_page_summaries,
    build_cache_summaries,
    build_page_summaries,
    build_quest_summaries,
    summary_bytes,
    write_page_summaries,
)

__all__ = [
    "PageSummaries",
    "QuestSummaries",
    "SharedBasisSummaries",
    "allocate_page_summaries",
    "attend_selected_pages",
    "attention_mass_kept",
    "build_cache_summaries",
    "build_page_summaries",
    "build_quest_summaries",
    "build_shared_basis_summaries",
    "dense_paged_attention",
    "fit_shared_basis",
    "gather_pages",
    "oracle_scores",
    "oracle_scores_by_row",
    "physical_page_ids",
    "quest_scores",
    "score_pages",
    "select_pages",
    "shared_basis_scores",
    "shared_rank_at_equal_bytes",
    "sparse_paged_attention",
    "summary_bytes",
    "window_scores",
    "write_page_summaries",
]
