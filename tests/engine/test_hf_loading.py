"""Config parsing, model resolution and weight loading, including every bad-input error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from tiny_checkpoints import COMMIT, build_checkpoint, model_dir, needs_ops

from keel.hf.config import ConfigError, ModelConfig
from keel.hf.resolve import DEFAULT_MODEL, ModelNotFoundError, resolve_model
from keel.hf.weights import WeightsError, iter_weights, weight_files
from keel.models import UnsupportedArchitectureError, get_model_class


def _copy(hf_cache: Path, arch: str, dest: Path) -> Path:
    shutil.copytree(model_dir(hf_cache, arch), dest)
    return dest


# the smallest valid config.json; each test adds or changes what it is about
TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 10,
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
}


def test_config_new_and_old_keys_agree():
    new = {
        **TINY_CONFIG,
        "dtype": "bfloat16",
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 5e5,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    }
    old = {k: v for k, v in new.items() if k not in ("dtype", "rope_parameters")}
    old |= {
        "torch_dtype": "bfloat16",
        "rope_theta": 5e5,
        "rope_scaling": {"type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64},
    }
    a, b = ModelConfig.from_dict(new), ModelConfig.from_dict(old)
    assert a == b
    assert a.torch_dtype == torch.bfloat16 and a.rope.rope_type == "llama3" and a.head_dim == 4
    assert a.num_key_value_heads == 2


@pytest.mark.parametrize(
    "change, message",
    [
        ({"num_key_value_heads": 3}, "multiple of num_key_value_heads"),
        ({"hidden_size": 0}, "hidden_size must be a positive integer"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0}}, "rope type 'yarn' is not supported"),
        ({"architectures": []}, "'architectures' is missing"),
    ],
)
def test_config_validation_errors(change, message):
    raw = TINY_CONFIG | change
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_dict(raw)


def test_family_flags(hf_cache):
    cfgs = {
        a: ModelConfig.from_file(model_dir(hf_cache, a) / "config.json")
        for a in ("qwen2", "qwen3", "mistral", "smollm2")
    }
    assert cfgs["qwen2"].attention_bias and not cfgs["qwen2"].qk_norm and cfgs["qwen2"].sliding_window is None
    assert cfgs["qwen3"].qk_norm and cfgs["qwen3"].head_dim == 32
    assert cfgs["mistral"].sliding_window == 8
    assert cfgs["smollm2"].tie_word_embeddings


def test_unsupported_architecture_names_supported():
    with pytest.raises(UnsupportedArchitectureError, match="LlamaForCausalLM.*Qwen3ForCausalLM"):
        get_model_class("GPT2LMHeadModel")


def test_unsupported_checkpoint_fails_before_loading(tmp_path):
    from keel.engine import LLM

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "n_embd": 8}))
    with pytest.raises(UnsupportedArchitectureError, match="'GPT2LMHeadModel' is not supported; supported: "):
        LLM(str(tmp_path))


def test_resolve_cache_and_local(hf_cache):
    folder = resolve_model("keel-test/tiny-llama")
    assert folder == model_dir(hf_cache, "llama")
    assert resolve_model(str(folder)) == folder
    assert resolve_model("keel-test/tiny-llama", revision=COMMIT) == folder


def test_resolve_through_hf_home(hf_cache, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(hf_cache.parent))  # the cache is $HF_HOME/hub
    assert resolve_model("keel-test/tiny-qwen3") == model_dir(hf_cache, "qwen3")
    with pytest.raises(ModelNotFoundError, match="revision 'v9'"):
        resolve_model("keel-test/tiny-qwen3", revision="v9")


def test_missing_model_says_where_it_looked(hf_cache, tmp_path):
    with pytest.raises(ModelNotFoundError, match=str(hf_cache)):
        resolve_model("keel-test/does-not-exist")
    with pytest.raises(ModelNotFoundError, match="keel models fetch-demo"):
        resolve_model(DEFAULT_MODEL)
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model(str(tmp_path / "nowhere" / "deeper" / "model"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model(str(tmp_path / "empty"))


def test_sharded_checkpoint_loads_like_single(hf_cache, tmp_path):
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model_dir(hf_cache, "qwen2") / name, tok_dir / name)
    build_checkpoint(tmp_path / "sharded", "qwen2", tok_dir, max_shard_size="100KB")
    files = weight_files(tmp_path / "sharded")
    assert len(files) > 1
    single = dict(iter_weights(model_dir(hf_cache, "qwen2")))
    sharded = dict(iter_weights(tmp_path / "sharded"))
    assert single.keys() == sharded.keys()
    assert all(torch.equal(single[k], sharded[k]) for k in single)


@pytest.mark.parametrize("damage", ["truncate", "garbage_header"])
def test_corrupt_safetensors_is_a_clear_error(hf_cache, tmp_path, damage):
    folder = _copy(hf_cache, "llama", tmp_path / "m")
    f = folder / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"\xff" * 64 + data[64:])
    with pytest.raises(WeightsError, match="truncated or corrupt"):
        list(iter_weights(folder))


@needs_ops
def test_shape_mismatch_and_missing_tensor(hf_cache, tmp_path):
    from keel.engine import LLM

    folder = _copy(hf_cache, "llama", tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg | {"intermediate_size": 96}))
    with pytest.raises(WeightsError, match=r"mlp\.\w+_proj\.weight. has shape \(\d+, \d+\); config.json implies"):
        LLM(str(folder), dtype="float32")
    (folder / "config.json").write_text(json.dumps(cfg | {"num_hidden_layers": 3}))
    with pytest.raises(WeightsError, match="missing .* tensors: model.layers.2"):
        LLM(str(folder), dtype="float32")


@needs_ops
def test_old_style_config_loads_same_logits(hf_cache, tmp_path, llms):
    from keel.engine import LLM, SamplingParams

    folder = _copy(hf_cache, "llama3", tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    rope = cfg.pop("rope_parameters")
    cfg |= {
        "rope_theta": rope.pop("rope_theta"),
        "rope_scaling": rope,
        "torch_dtype": cfg.pop("dtype", "float32"),
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    old = LLM(str(folder), dtype="float32").generate("The quick brown fox", params)[0]
    assert old.token_ids == llms("llama3").generate("The quick brown fox", params)[0].token_ids


@needs_ops
def test_prompt_longer_than_context(llms):
    from keel.engine import SamplingParams

    llm = llms("llama")
    with pytest.raises(ValueError, match="context is 128 tokens"):
        llm.generate([[5] * 200], SamplingParams(max_tokens=4))
    out = llm.generate([[5] * 120], SamplingParams(max_tokens=50, ignore_eos=True))[0]
    assert len(out.token_ids) == 8 and out.finish_reason == "length"  # capped at the context
