"""The device-side statistics of the CUDA path (``vllm_backend.device_stats``) write the same records as the
host-side ones of the CPU path (``vllm_backend.step_stats``), and the KV cache share that leaves room for the
summaries (``vllm_backend.memory``). Runs on the CPU, and on a CUDA device where there is one (there inside a
CUDA graph too)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from locks_engine.stats import StatsRing
from locks_engine.vllm_backend.device_stats import SLOTS, DeviceStepStats
from locks_engine.vllm_backend.step_stats import StepStats

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
PAGE = 16
LAYERS = ["model.layers.0.attn", "model.layers.1.attn", "model.layers.2.attn"]


def _selection(gen, seq_lens: list[int], heads: int, width: int) -> torch.Tensor:
    """int64 `[S, H, width]` distinct ascending pages of each row, ``-1`` padded (as select_pages returns)."""
    out = torch.full((len(seq_lens), heads, width), -1, dtype=torch.int64)
    for s, n in enumerate(seq_lens):
        pages = -(-n // PAGE)
        for h in range(heads):
            k = min(width, pages, int(torch.randint(1, width + 1, (1,), generator=gen)))
            out[s, h, :k] = torch.randperm(pages, generator=gen)[:k].sort().values
    return out


def _rings(tmp_path, max_pages: int):
    host = StatsRing.create(tmp_path / "host.bin", max_pages=max_pages, page_size=PAGE, max_rows=4)
    device = StatsRing.create(tmp_path / "device.bin", max_pages=max_pages, page_size=PAGE, max_rows=4)
    return host, device


def _host_step(stats: StepStats, selections, seq_lens, every: bool, prefill_tokens: int) -> None:
    """What ``impl._count`` does per layer on the CPU path."""
    stats.reset(seq_lens, prefill_tokens)
    lens = torch.tensor(seq_lens, dtype=torch.long)
    for selected in selections:
        num_pages = (lens + PAGE - 1) // PAGE if seq_lens else None
        scored = 0 if every else int((lens // PAGE).sum())
        stats.add_layer(selected if seq_lens else None, num_pages, scored, 2)
    stats.flush()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seq_lens, every", [([700, 33, 5000, 16, 129], False), ([40, 17], True), ([], False)],
                         ids=["five_rows_past_max_rows", "every_page", "prefill_only"])
def test_device_records_equal_host_records(tmp_path, device, seq_lens, every):
    gen = torch.Generator().manual_seed(0)
    host_ring, device_ring = _rings(tmp_path, max_pages=400)
    host = StepStats(host_ring, page_bytes=4096, summary_page_bytes=720)
    dev = DeviceStepStats(device_ring, 4096, 720, LAYERS, num_kv_heads=2, max_num_seqs=8, device=torch.device(device))
    for step in range(3):
        selections = [_selection(gen, seq_lens, 2, 8) for _ in LAYERS]
        _host_step(host, selections, seq_lens, every, prefill_tokens=11 * step)
        lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
        for name, selected in zip(LAYERS, selections):
            dev.count(name, selected.to(device) if seq_lens else None, every, lens,
                      torch.tensor(11 * step, dtype=torch.int32, device=device))
        if device == "cuda":
            torch.cuda.synchronize()
        assert dev.collect() == 1
    assert host_ring.written() == device_ring.written() == 3
    for want, got in zip(host_ring.latest(3), device_ring.latest(3)):
        for field in ("step", "num_decodes", "num_prefill_tokens", "num_layers", "num_kv_heads", "pages_read",
                      "pages_total", "summaries_read", "bytes_read", "bytes_dense"):
            assert got[field] == want[field], field
        for field in ("row_seq_len", "row_pages_read", "row_pages_total", "row_hist"):
            np.testing.assert_array_equal(got[field], want[field], err_msg=field)


@pytest.mark.parametrize("device", DEVICES)
def test_device_records_carry_the_tail_share_as_host_records_do(tmp_path, device):
    """Each row's tail share summed over layers and KV heads; a step without a tail (every page read) gives 0,
    not the previous step's."""
    gen = torch.Generator().manual_seed(1)
    seq_lens = [700, 33, 5000, 16, 129]
    host_ring, device_ring = _rings(tmp_path, max_pages=400)
    host = StepStats(host_ring, page_bytes=4096, summary_page_bytes=720)
    dev = DeviceStepStats(device_ring, 4096, 720, LAYERS, num_kv_heads=2, max_num_seqs=8, device=torch.device(device))
    lens = torch.tensor(seq_lens)
    sums = []
    for tailed in (True, False):
        selections = [_selection(gen, seq_lens, 2, 8) for _ in LAYERS]
        shares = [torch.rand(len(seq_lens), 2, generator=gen) if tailed else None for _ in LAYERS]
        host.reset(seq_lens, 0)
        for name, selected, share in zip(LAYERS, selections, shares):
            host.add_layer(selected, (lens + PAGE - 1) // PAGE, 0, 2, share)
            dev.count(name, selected.to(device), False, lens.to(device, torch.int32),
                      torch.tensor(0, dtype=torch.int32, device=device),
                      tail_share=None if share is None else share.to(device))
        host.flush()
        if device == "cuda":
            torch.cuda.synchronize()
        assert dev.collect() == 1
        sums.append(torch.stack(shares).sum((0, 2))[:4].numpy() if tailed else np.zeros(4))
    for want, got, expected in zip(host_ring.latest(2), device_ring.latest(2), sums):
        np.testing.assert_allclose(want["row_tail_mass"], expected, rtol=1e-6)
        np.testing.assert_allclose(got["row_tail_mass"], expected, rtol=1e-6)
    assert sums[0].min() > 0


def test_collect_appends_each_finished_step_once_and_skips_a_slot_being_copied(tmp_path):
    _, ring = _rings(tmp_path, max_pages=64)
    dev = DeviceStepStats(ring, 4096, 720, LAYERS[:1], num_kv_heads=1, max_num_seqs=2, device=torch.device("cpu"))
    lens, none = torch.tensor([64], dtype=torch.int32), torch.tensor(0, dtype=torch.int32)
    selected = torch.tensor([[[0, 3, -1]]])
    for _ in range(3):  # the host fell behind by three steps: all three come, oldest first
        dev.count(LAYERS[0], selected, False, lens, none)
    assert dev.collect() == 3 and dev.collect() == 0
    assert [r["step"] for r in ring.latest(3)] == [1, 2, 3]
    dev.count(LAYERS[0], selected, False, lens, none)
    dev.host_tails[4 % SLOTS] = 3  # step 4's body is copied, its tail not yet
    assert dev.collect() == 0
    dev.host_tails[4 % SLOTS] = 4
    assert dev.collect() == 1 and ring.latest(1)[0]["step"] == 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_replayed_cuda_graph_records_every_step(tmp_path):
    _, ring = _rings(tmp_path, max_pages=64)
    dev = DeviceStepStats(ring, 4096, 720, LAYERS, num_kv_heads=2, max_num_seqs=2, device=torch.device("cuda"))
    selected = torch.tensor([[[0, 2, -1], [1, -1, -1]]], device="cuda")
    lens = torch.tensor([40], dtype=torch.int32, device="cuda")
    none = torch.tensor(0, dtype=torch.int32, device="cuda")

    def step():
        for name in LAYERS:
            dev.count(name, selected, False, lens, none)

    step()  # eager warm-up: allocates the selection buffer
    torch.cuda.synchronize()
    dev.collect()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(5):
        graph.replay()
        torch.cuda.synchronize()
        dev.collect()
    records = ring.latest(6)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert all(r["pages_read"] == 3 * 3 and r["pages_total"] == 3 * 3 * 2 for r in records)


def test_kv_share_leaves_the_summaries_their_bytes():
    from locks_engine.vllm_backend.memory import kv_share

    kv = kv_share(118 * 2**30, 0.176)
    assert kv + int(kv * 0.176) <= 118 * 2**30 < kv + int(kv * 0.176) + 2


def test_summary_fraction_only_for_locks_with_summaries():
    from locks_engine.config import LocksConfig
    from locks_engine.ops.select import summary_fraction
    from locks_engine.vllm_backend.memory import locks_summary_fraction

    def config(backend: str, locks: dict) -> SimpleNamespace:
        model = SimpleNamespace(get_head_size=lambda: 128, dtype=torch.bfloat16)
        return SimpleNamespace(attention_config=SimpleNamespace(backend=SimpleNamespace(name=backend)),
                               additional_config={"locks": locks}, model_config=model)

    want = summary_fraction(LocksConfig(), 128, torch.bfloat16)
    assert 0.17 < want < 0.2
    assert locks_summary_fraction(config("CUSTOM", {"selection": "flat"})) == pytest.approx(want)
    assert locks_summary_fraction(config("FLASH_ATTN", {})) == 0.0
    assert locks_summary_fraction(config("CUSTOM", {"dense": True})) == 0.0
    two = locks_summary_fraction(config("CUSTOM", {"selection": "two-level"}))
    assert two == pytest.approx(want + 1 / 32)  # + the superpage centroids: 2 D of 4 B D bytes
    assert locks_summary_fraction(config("CUSTOM", {})) == pytest.approx(two)  # the default
    # the tail estimate's mean values: D + 2 bytes (int8) or 2 D (bf16) a page and KV head over 2 B D bf16 K+V
    tail = locks_summary_fraction(config("CUSTOM", {"selection": "flat", "tail": "int8"}))
    assert tail == pytest.approx(want + 130 / (2 * 16 * 128 * 2))
    oracle = locks_summary_fraction(config("CUSTOM", {"selection": "oracle", "tail": "bf16"}))
    assert oracle == pytest.approx(256 / (2 * 16 * 128 * 2))  # no summaries, the means only
    with pytest.raises(ValueError, match="budget"):
        locks_summary_fraction(config("CUSTOM", {"budget": -1}))


@pytest.mark.parametrize("seq_len", [1, 16, 17, 5000])
def test_dense_record_equals_what_the_ring_records_for_every_page(tmp_path, seq_len):
    """The records the engine writes for vLLM's own dense backend (no ring there) are those the LOCKS ring
    holds for a step that reads every page unscored."""
    from locks_engine.ops.select import every_page
    from locks_engine.stats import dense_step_record

    max_pages = 20000  # past MAX_BINS: pages are binned
    ring = StatsRing.create(tmp_path / "ring.bin", max_pages=max_pages, page_size=PAGE)
    stats = StepStats(ring, page_bytes=4096, summary_page_bytes=0)
    selected = every_page(torch.tensor([seq_len]), 2, -(-seq_len // PAGE), PAGE)
    _host_step(stats, [selected] * 3, [seq_len], every=True, prefill_tokens=0)
    want = ring.latest(1)[0]
    got = dense_step_record(seq_len, 3, 2, PAGE, 4096, max_pages)
    assert got["pages_per_bin"] == int(ring.header["pages_per_bin"]) > 1
    for field in ("num_decodes", "pages_read", "pages_total", "summaries_read", "bytes_read", "bytes_dense"):
        assert got[field] == want[field], field
    for field in ("row_seq_len", "row_pages_read", "row_pages_total", "row_hist"):
        np.testing.assert_array_equal(got[field], want[field], err_msg=field)


@pytest.mark.parametrize("device", DEVICES)
def test_calibrated_layers_count_their_scan_as_fixed_layers_do(tmp_path, device):
    """A calibrated layer hands its superpages chosen as an int32 `[1]` on the device (read as data inside the
    graph); the step counts those layers together and records what the same slots given as ints record."""
    gen = torch.Generator().manual_seed(2)
    seq_lens = [16 * 16 * 20 + 3, 700, 16 * 16 * 4]
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    slots = [3, 8, 3]
    records = []
    for live in (False, True):
        ring = StatsRing.create(tmp_path / f"live{live}.bin", max_pages=400, page_size=PAGE, max_rows=4)
        dev = DeviceStepStats(ring, 4096, 720, LAYERS, num_kv_heads=2, max_num_seqs=8, device=torch.device(device))
        for name, n in zip(LAYERS, slots):
            selected = _selection(gen, seq_lens, 2, 8).to(device)
            given = torch.tensor([n], dtype=torch.int32, device=device) if live else n
            dev.count(name, selected, False, lens, torch.tensor(0, dtype=torch.int32, device=device),
                      two_level=(given, 0.25))
        if device == "cuda":
            torch.cuda.synchronize()
        assert dev.collect() == 1
        records.append(ring.latest(1)[0])
    fixed, calibrated = records
    flat = 3 * 2 * sum(n // PAGE for n in seq_lens)
    assert 0 < fixed["summaries_read"] < flat
    assert calibrated["summaries_read"] == fixed["summaries_read"]
    assert calibrated["bytes_read"] - calibrated["pages_read"] * 4096 == fixed["summaries_read"] * 720
