"""``locks_chat.engine_client.open_tokenizer``: the model's tokenizer and context before the engine starts, on a tiny
word-level tokenizer saved as a Hugging Face model directory (no weights, no vLLM)."""

from __future__ import annotations

import json

import pytest

from locks_chat.engine_client import open_tokenizer
from locks_chat.errors import ModelPathError
from locks_chat.ingest import load_document
from locks_chat.prompt import build_prompt
from tests.support.tui_support import write_book

pytest.importorskip("transformers")

TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}<|assistant|>\n"


def tiny_model(path, chat_template: str | None = TEMPLATE, **config):
    """A model directory with a word-level fast tokenizer (``[UNK]`` for every word it does not know)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "the", "keeper", "password", "is", "blue", ".", "p", "[", "]", "1", "<", "|", ">"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    tokenizer.chat_template = chat_template
    path.mkdir()
    tokenizer.save_pretrained(path)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", **config}))
    return path


def test_tokenizer_and_context_of_a_local_model(tmp_path):
    model = tiny_model(tmp_path / "model", max_position_embeddings=512)
    counted = open_tokenizer(str(model), None)
    assert counted is not None and counted.max_context == 512
    document = load_document(write_book(tmp_path))
    prompt = build_prompt(counted.tokenizer, document, ["What is the password?"])
    assert len(prompt.token_ids) > prompt.document_tokens > 0 and len(prompt.pages) == 4
    assert open_tokenizer(str(model), 300).max_context == 300, "--context is the context the engine gets"


@pytest.mark.parametrize(
    "make",
    [
        lambda path: tiny_model(path, max_position_embeddings=512, chat_template=None),
        lambda path: tiny_model(path),
        lambda path: (tiny_model(path, max_position_embeddings=512) / "tekken.json").write_text("{}"),
    ],
    ids=["no_chat_template", "no_context_length", "mistral_tokenizer"],
)
def test_what_only_the_engine_can_tell_is_left_to_it(tmp_path, make):
    make(tmp_path / "model")
    assert open_tokenizer(str(tmp_path / "model"), None) is None


def test_hub_ids_and_a_model_still_to_convert_are_left_to_the_engine(monkeypatch):
    from locks_engine import gguf_convert, models

    monkeypatch.setattr(gguf_convert, "_convert_into", lambda *a: pytest.fail("converted"))
    monkeypatch.setattr(models.socket, "getaddrinfo", lambda host, port: [("resolved", host, port)])
    assert open_tokenizer("org/model", None) is None
    assert open_tokenizer(None, None, convert=False) is None


def test_a_missing_model_is_bad_input_as_open_engine_says(tmp_path):
    with pytest.raises(ModelPathError, match="no such model directory") as info:
        open_tokenizer(str(tmp_path / "nowhere"), None)
    assert info.value.exit_code == 2
