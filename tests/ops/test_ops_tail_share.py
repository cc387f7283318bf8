"""locks_engine.ops.tail: the share of the estimated attention mass that the tail carries (what the app shows)."""

from __future__ import annotations

import torch

from locks_engine.ops.tail import tail_mass_share


def test_share_is_the_unread_pages_estimated_mass_over_every_complete_page_averaged_over_the_group():
    gen = torch.Generator().manual_seed(0)
    seqs, heads, group, pmax, page_size = 2, 2, 3, 6, 4
    scores = torch.randn(seqs, heads * group, pmax, generator=gen) * 3
    seq_lens = torch.tensor([21, 13])  # 5 and 3 complete pages; the last page of each row is incomplete
    scores[1, :, 4:] = float("-inf")  # pages past the row have no score
    selected = torch.tensor([[[0, 3, 5], [1, 2, -1]], [[0, 3, -1], [-1, -1, -1]]])
    share = tail_mass_share(scores, selected, seq_lens, page_size)
    ref = torch.zeros(seqs, heads)
    for s in range(seqs):
        complete = int(seq_lens[s]) // page_size
        for h in range(heads):
            read = {int(p) for p in selected[s, h] if p >= 0}
            tail = [j for j in range(complete) if j not in read]
            per_q = []
            for g in range(group):
                mass = scores[s, h * group + g, :complete].exp()
                per_q.append(float(mass[tail].sum() / mass.sum()))
            ref[s, h] = sum(per_q) / group
    assert torch.allclose(share, ref, atol=1e-6)
    # row 0, head 0 leaves pages 1, 2, 4: a share strictly between 0 and 1; row 1, head 1 reads nothing: all of it
    assert 0 < share[0, 0] < 1 and torch.allclose(share[1, 1], torch.ones(()))


def test_share_is_zero_when_every_complete_page_is_read_or_none_is_complete():
    scores = torch.randn(2, 2, 4)
    seq_lens = torch.tensor([40, 3])  # 2 complete pages of 16; none
    selected = torch.tensor([[[0, 1, 2]], [[-1, -1, -1]]])
    share = tail_mass_share(scores, selected, seq_lens, 16)
    assert torch.equal(share, torch.zeros(2, 1))
