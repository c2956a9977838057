"""Config parsing, model resolution and weight loading, including every bad-input error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from keel_dev.checkpoints import COMMIT, build_checkpoint, model_dir
from support.native import needs_ops

import keel.engine  # noqa: F401  (keel.models imports keel.engine: importing keel.models first is a cycle)
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
        ({"num_key_value_heads": 3}, r"num_key_value_heads must divide num_attention_heads \(2\), got 3"),
        ({"hidden_size": 0}, r"hidden_size must be an integer in \[1, 131072\], got 0"),
        ({"hidden_act": "gelu"}, "hidden_act must be one of 'silu', got 'gelu'"),
        (
            {"rope_parameters": {"rope_type": "yarn", "factor": 2.0}},
            "rope_parameters.rope_type: rope type 'yarn' is not",
        ),
        ({"architectures": []}, "'architectures' is missing"),
        ({"architectures": ["GPT2LMHeadModel"]}, r"architectures\[0\] 'GPT2LMHeadModel' is not supported"),
        ({"num_attention_heads": 3}, r"num_attention_heads must be a positive int dividing hidden_size \(8\), got 3"),
        ({"vocab_size": 10**12}, r"vocab_size must be an integer in \[1, 16777216\], got 1000000000000"),
        ({"max_position_embeddings": 10**12}, r"max_position_embeddings must be an integer in \[1, 2097152\]"),
        ({"hidden_size": True}, "hidden_size must be an integer .*, got True"),
        ({"intermediate_size": 16.0}, "intermediate_size must be an integer .*, got 16.0"),
        ({"rms_norm_eps": float("nan")}, r"rms_norm_eps must be a finite number in \(0, 1\), got nan"),
        ({"rms_norm_eps": 0}, "rms_norm_eps must be a finite number"),
        ({"tie_word_embeddings": [1]}, r"tie_word_embeddings must be true or false, got \[1\]"),
        ({"eos_token_id": 10}, r"eos_token_id must be a token id in \[0, 9\]"),
        ({"eos_token_id": [1, "x"]}, "eos_token_id must be a token id"),
        ({"bos_token_id": -1}, "bos_token_id must be a token id"),
        ({"torch_dtype": "float99"}, "torch_dtype must be the name of a torch dtype"),
        ({"rope_scaling": "llama3"}, "rope_scaling must be a JSON object or null, got 'llama3'"),
        ({"rope_scaling": {"factor": 2.0}}, "rope_scaling must name its rope_type"),
        ({"rope_theta": float("inf")}, "rope_theta must be a finite number"),
        ({"sliding_window": 0}, r"sliding_window must be an integer in \[1, "),
        (
            {
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "original_max_position_embeddings": 64,
                    "low_freq_factor": 4.0,
                    "high_freq_factor": 4.0,
                }
            },
            "llama3 rope scaling needs high_freq_factor > low_freq_factor > 0",
        ),
        (
            {"rope_scaling": {"rope_type": "llama3", "factor": "8", "original_max_position_embeddings": 64}},
            r"rope_scaling\.factor must be a finite number in \[1, 1e\+06\], got '8'",
        ),
        (
            {"rope_parameters": {"rope_type": "llama3", "factor": 8.0}},
            "rope_parameters.original_max_position_embeddings must be an integer .*, it is missing",
        ),
    ],
)
def test_config_validation_errors(change, message):
    raw = TINY_CONFIG | change
    with pytest.raises(ConfigError, match="^config.json: " + message):
        ModelConfig.from_dict(raw)


def test_config_accepts_what_transformers_writes(hf_cache):
    # null for an optional field means its default, as transformers writes unset fields
    raw = TINY_CONFIG | {"num_key_value_heads": None, "head_dim": None, "sliding_window": None, "rope_scaling": None}
    cfg = ModelConfig.from_dict(raw)
    assert (cfg.num_key_value_heads, cfg.head_dim, cfg.sliding_window) == (2, 4, None)
    for arch in ("llama", "llama3", "smollm2", "qwen2", "qwen3", "mistral"):
        ModelConfig.from_file(model_dir(hf_cache, arch) / "config.json")


def test_config_architectures_agree_with_the_model_registry():
    from keel.hf.config import ARCHITECTURES
    from keel.models import MODEL_REGISTRY

    assert set(ARCHITECTURES) == set(MODEL_REGISTRY)


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
    with pytest.raises(ConfigError, match="config.json: .*'GPT2LMHeadModel' is not supported; supported: "):
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
    message = "needs bytes .* the file is truncated" if damage == "truncate" else "header length field says"
    with pytest.raises(WeightsError, match=f"model.safetensors: .*{message}"):
        list(iter_weights(folder))


@needs_ops
def test_shape_mismatch_and_missing_tensor(hf_cache, tmp_path):
    from keel.engine import LLM

    folder = _copy(hf_cache, "llama", tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg | {"intermediate_size": 96}))
    shape = r"mlp\.\w+_proj\.weight' has shape \(\d+, \d+\), but config.json \(intermediate_size=96, hidden_size=64\)"
    with pytest.raises(WeightsError, match=shape):
        LLM(str(folder), dtype="float32")
    (folder / "config.json").write_text(json.dumps(cfg | {"num_hidden_layers": 3}))
    with pytest.raises(
        WeightsError,
        match=r"model.safetensors: 9 tensors that config.json implies are missing .*"
        r"num_hidden_layers=3\): model.layers.2",
    ):
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


@pytest.mark.parametrize("arch", ["llama", "llama3", "smollm2", "qwen2", "qwen3", "mistral"])
def test_expected_tensors_are_exactly_what_transformers_saves(hf_cache, arch):
    # the header check and keel's loader must agree on every architecture: what transformers saves is valid
    from keel.hf.checkpoint import expected_tensors, skipped
    from keel.hf.weights import validate_checkpoint

    folder = model_dir(hf_cache, arch)
    cfg = ModelConfig.from_file(folder / "config.json")
    seen = validate_checkpoint(folder, cfg)
    expected = expected_tensors(cfg)
    assert {n for n in seen if not skipped(n, cfg)} == set(expected)
    assert all(seen[n][1].shape == expected[n][0] for n in expected)


def _resave(folder: Path, change) -> None:
    """Rewrite model.safetensors with `change(tensors)` applied."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def test_unknown_extra_tensor_is_refused_and_tied_lm_head_skipped(hf_cache, tmp_path):
    from keel.hf.weights import validate_checkpoint

    folder = _copy(hf_cache, "smollm2", tmp_path / "m")  # tied embeddings
    cfg = ModelConfig.from_file(folder / "config.json")
    _resave(folder, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"].clone()}))
    validate_checkpoint(folder, cfg)  # a tied lm_head is skipped, as the loader skips it
    _resave(folder, lambda t: t.update({"model.layers.0.mlp.extra.weight": torch.zeros(2)}))
    with pytest.raises(
        WeightsError, match="'model.layers.0.mlp.extra.weight' is not part of LlamaForCausalLM .*refuses"
    ):
        validate_checkpoint(folder, cfg)


def test_non_float_weight_is_refused(hf_cache, tmp_path):
    from keel.hf.weights import validate_checkpoint

    folder = _copy(hf_cache, "llama", tmp_path / "m")
    cfg = ModelConfig.from_file(folder / "config.json")
    name = "model.norm.weight"
    _resave(folder, lambda t: t.update({name: t[name].to(torch.int32)}))
    with pytest.raises(WeightsError, match=f"'{name}' has dtype I32; keel loads F32, F16, BF16, F64 weights"):
        validate_checkpoint(folder, cfg)


def test_nan_weight_is_refused_while_loading(hf_cache, tmp_path):
    folder = _copy(hf_cache, "llama", tmp_path / "m")
    name = "model.layers.1.post_attention_layernorm.weight"
    _resave(folder, lambda t: t[name].__setitem__(3, float("nan")))
    with pytest.raises(WeightsError, match=f"model.safetensors: tensor '{name}' holds NaN or infinite values"):
        list(iter_weights(folder))


@needs_ops
def test_shapes_are_checked_before_the_model_is_built(hf_cache, tmp_path, monkeypatch):
    from keel.engine import LLM
    from keel.models.llama import LlamaForCausalLM

    folder = _copy(hf_cache, "llama", tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg | {"vocab_size": cfg["vocab_size"] * 1000}))
    built: list[object] = []
    init = LlamaForCausalLM.__init__

    def spy(self, config):
        built.append(config)
        init(self, config)

    monkeypatch.setattr(LlamaForCausalLM, "__init__", spy)
    with pytest.raises(WeightsError, match=r"(lm_head|embed_tokens).weight' has shape .* config.json \(vocab_size="):
        LLM(str(folder), dtype="float32")
    assert built == []  # refused from the header, before any parameter was allocated


def test_sharded_index_is_checked(hf_cache, tmp_path):
    folder = _copy(hf_cache, "llama", tmp_path / "m")
    index = folder / "model.safetensors.index.json"
    for weight_map, message in (
        ({"model.norm.weight": "../elsewhere.safetensors"}, "must be a .safetensors file name in the same folder"),
        ({"model.norm.weight": "model-2.safetensors"}, "shards it lists are missing"),
        ({"model.nope.weight": "model.safetensors"}, "puts tensor 'model.nope.weight' in model.safetensors, whose"),
        (5, "weight_map must be a non-empty object"),
    ):
        index.write_text(json.dumps({"weight_map": weight_map}))
        with pytest.raises(WeightsError, match=f"model.safetensors.index.json: .*{message}"):
            weight_files(folder)
