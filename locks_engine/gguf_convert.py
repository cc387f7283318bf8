"""A GGUF causal LM made into a plain Hugging Face directory (safetensors, tokenizer, ``generation_config.json``)
that vLLM loads: dequantized by transformers + gguf, saved in bf16, written atomically.

vLLM does not load these GGUFs, so the built-in models (``locks_engine.builtin_models``) are converted once into
a cache directory. The conversion writes into a temporary sibling directory and renames it into place as its last
step, so an interrupted conversion never leaves a half-made model behind (a killed process leaves ``.tmp-<pid>-*``
entries that the next conversion removes). transformers and gguf are imported lazily, only when converting.

What the GGUF carries and the directory gets: the weights; the tokenizer with its chat template; the special
tokens' ids (``generation_config.json``), and the sampling settings llama.cpp writes under ``general.sampling.*``
(:data:`GGUF_SAMPLING`) when the file has them (the built-in models' files have none). An untied output head
(``output.weight``, Qwen2.5's GGUF stores one beside ``token_embd.weight``, in another quantization) stays untied:
it is the head the GGUF's own runtime uses; ``conversion_info.json`` records how far it is from the embeddings.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
import tempfile
from pathlib import Path

from locks_engine.models import INSTALL_HINT, CacheDirError, ModelError

#: ``generation_config.json`` keys from llama.cpp's GGUF sampling keys (gguf-py ``Keys.General.SAMPLING_*``)
GGUF_SAMPLING = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_k": "top_k",
    "general.sampling.top_p": "top_p",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
}
#: ``generation_config.json`` keys from the GGUF's special tokens
GGUF_TOKENS = {
    "tokenizer.ggml.bos_token_id": "bos_token_id",
    "tokenizer.ggml.eos_token_id": "eos_token_id",
    "tokenizer.ggml.padding_token_id": "pad_token_id",
}


def convert_gguf(gguf_path: Path, target: Path, dtype: str = "bfloat16") -> Path:
    """Dequantize a GGUF causal LM and save it at ``target`` as safetensors + tokenizer, atomically.

    Args:
        gguf_path (Path): the ``.gguf`` file.
        target (Path): the directory to create; must not exist (if another process made it meanwhile, its
            copy wins and ours is dropped).
        dtype (str): ``bfloat16`` (default, ~2 bytes per weight), ``float16`` or ``float32``.

    Returns:
        Path: ``target``.

    Raises:
        ModelError: transformers, gguf or accelerate is missing, or transformers fails to read the GGUF.
        CacheDirError: ``target``'s parent cannot be written.
    """
    for module in ("transformers", "gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise ModelError(f"converting {gguf_path.name} needs the package {module!r}: {INSTALL_HINT}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(target.parent)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{os.getpid()}-", dir=target.parent))
    except OSError as err:
        raise CacheDirError(target.parent, str(err.strerror or err)) from err
    try:
        try:
            _convert_into(gguf_path, tmp, dtype)
        except Exception as err:
            first_line = (str(err).splitlines() or [""])[0]
            raise ModelError(f"converting {gguf_path.name} failed: {type(err).__name__}: {first_line}") from err
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def remove_stale_temps(parent: Path) -> None:
    """Delete the ``.tmp-<pid>-*`` directories (a half-made model, a reassembled GGUF) left by conversions whose
    process is gone."""
    for entry in parent.glob(".tmp-*-*"):
        pid = entry.name.split("-")[1]
        if pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def gguf_generation_config(gguf_path: Path) -> dict[str, object]:
    """What ``generation_config.json`` takes from the GGUF's metadata: the special tokens' ids
    (:data:`GGUF_TOKENS`) and the sampling settings it states (:data:`GGUF_SAMPLING`; none when it states none)."""
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf_path)).fields
    out: dict[str, object] = {}
    for key, name in {**GGUF_TOKENS, **GGUF_SAMPLING}.items():
        if key in fields:
            value = fields[key].contents()
            out[name] = round(value, 6) if isinstance(value, float) else value
    if "temperature" in out:
        out["do_sample"] = out["temperature"] > 0
    return out


def _convert_into(gguf_path: Path, out: Path, dtype: str) -> None:
    """Load the GGUF with transformers (dequantized to fp32), save it as a plain checkpoint in ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    folder, name = str(gguf_path.parent), gguf_path.name
    # the callers say that the model is being converted; transformers' progress bars would print over it (the
    # GGUF reader's own tqdm bar ignores transformers' switch, so its stderr is kept too; failures still raise)
    hf_logging.disable_progress_bar()
    with contextlib.redirect_stderr(io.StringIO()):
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # transformers 5 attaches a GGUF quantizer that cannot be serialized; the weights are already dequantized.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    tied = embed.data_ptr() == head.data_ptr()
    with torch.no_grad():
        head_vs_embed = 0.0 if tied else float((head - embed).norm() / embed.norm())
    model = model.to(getattr(torch, dtype))
    model.config.dtype = dtype
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _patch_for_older_readers(out, dtype)
    _write_generation_config(out, gguf_generation_config(gguf_path))
    info = {"source_gguf": name, "dtype": dtype, "tied_embeddings": tied,
            "head_vs_embeddings_rel_diff": round(head_vs_embed, 4)}
    (out / "conversion_info.json").write_text(json.dumps(info, indent=1))
    for entry in out.iterdir():
        entry.chmod(0o644)
    out.chmod(0o755)


def _write_generation_config(out: Path, from_gguf: dict[str, object]) -> None:
    """``generation_config.json`` as transformers saved it (if it did), with the GGUF's values over it."""
    path = out / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    config.update(from_gguf)
    path.write_text(json.dumps(config, indent=2) + "\n")


def _patch_for_older_readers(out: Path, dtype: str) -> None:
    """Add the transformers 4.x keys (``rope_theta``, ``torch_dtype``, inline chat template, a tokenizer class
    both 4.x and 5.x know) so that older vLLM builds (0.26 on the GPU machine) read the directory too."""
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    rope = config.get("rope_parameters") or {}
    if "rope_theta" in rope:
        config.setdefault("rope_theta", rope["rope_theta"])
    if rope.get("rope_type", "default") != "default":
        config.setdefault("rope_scaling", rope)
    config.setdefault("torch_dtype", dtype)
    config_path.write_text(json.dumps(config, indent=2))
    tok_path = out / "tokenizer_config.json"
    tok = json.loads(tok_path.read_text())
    if tok.get("tokenizer_class") == "TokenizersBackend":
        tok["tokenizer_class"] = "PreTrainedTokenizerFast"
    template = out / "chat_template.jinja"
    if template.is_file():
        tok.setdefault("chat_template", template.read_text())
    tok_path.write_text(json.dumps(tok, indent=2))
