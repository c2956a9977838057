"""keel.gguf.convert: q/k permutation, tensor mapping, config and a tiny model that transformers loads."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from support.gguf_synth import T_F32, llamacpp_permute, tiny_llama, write_gguf

from keel.gguf.convert import convert_state_dict, hf_name, permute_qk, unpermute_qk, write_checkpoint
from keel.gguf.reader import GGUFError, read_gguf


@pytest.mark.parametrize(("rows", "heads"), [(64, 4), (32, 2), (576, 9), (192, 3)])
def test_permutation_round_trip(rows, heads):
    w = torch.randn(rows, 8)
    stored = permute_qk(w, heads)
    assert torch.equal(stored, torch.from_numpy(llamacpp_permute(w.numpy(), heads)))
    assert not torch.equal(stored, w)
    assert torch.equal(unpermute_qk(stored, heads), w)


def test_name_mapping():
    assert hf_name("blk.12.ffn_down.weight") == "model.layers.12.mlp.down_proj.weight"
    assert hf_name("output.weight") == "lm_head.weight"
    with pytest.raises(GGUFError, match="'blk.0.attn_qkv.weight' is not part of a llama model"):
        hf_name("blk.0.attn_qkv.weight")


@pytest.mark.parametrize("tied", [True, False])
def test_state_dict_matches_reference(tmp_path, tied):
    model = tiny_llama(tied=tied)
    with read_gguf(write_gguf(tmp_path / "t.gguf", model.spec)) as g:
        state = convert_state_dict(g, torch.float32)
    assert sorted(state) == sorted(model.expected)
    for name, want in model.expected.items():
        np.testing.assert_array_equal(state[name].numpy(), want, err_msg=name)


def test_checkpoint_loads_in_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    model = tiny_llama()
    out = tmp_path / "ckpt"
    out.mkdir()
    write_checkpoint(write_gguf(tmp_path / "t.gguf", model.spec), out, "float32")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    assert (config["num_key_value_heads"], config["head_dim"], config["eos_token_id"]) == (2, 16, 2)

    ours = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ref = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).eval()
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in model.expected.items()}, strict=False)
    ref.tie_weights()
    ids = torch.tensor([[1, 50, 60, 70, 80, 2, 30]])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, ref(ids).logits, rtol=0, atol=1e-5)

    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.eos_token == "<|im_end|>" and tok.bos_token == "<|im_start|>"
    assert tok.encode("<|im_start|>he<|im_end|>") == [1, model.tokens.index("he"), 2]
    assert tok.encode(" the") == [model.tokens.index("Ġthe")]
    assert tok.decode(tok.encode("héllo 42 wörld")) == "héllo 42 wörld"
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_inconsistent_metadata_is_reported(tmp_path):
    model = tiny_llama()
    model.spec.tensors[1] = ("blk.0.attn_norm.weight", T_F32, (32,), np.zeros(32, np.float32).tobytes())
    with (
        read_gguf(write_gguf(tmp_path / "t.gguf", model.spec)) as g,
        pytest.raises(GGUFError, match=r"'blk.0.attn_norm.weight' has shape \(32,\), expected \(64,\)"),
    ):
        convert_state_dict(g)
    model = tiny_llama()
    del model.spec.tensors[-1]  # output_norm
    with (
        read_gguf(write_gguf(tmp_path / "u.gguf", model.spec)) as g,
        pytest.raises(GGUFError, match=r"1 tensors that the metadata implies are missing \(llama.block_count=2\)"),
    ):
        convert_state_dict(g)
    model = tiny_llama()
    model.spec.metadata[0] = ("general.architecture", 8, "mamba")
    with (
        read_gguf(write_gguf(tmp_path / "v.gguf", model.spec)) as g,
        pytest.raises(GGUFError, match="'mamba'"),
    ):
        convert_state_dict(g)


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2", ""])
def test_unknown_pre_tokenizer_is_a_clear_error(tmp_path, pre):
    from keel.gguf.tokenizer import build_tokenizer

    model = tiny_llama()
    i = next(n for n, (k, _, _) in enumerate(model.spec.metadata) if k == "tokenizer.ggml.pre")
    model.spec.metadata[i] = ("tokenizer.ggml.pre", model.spec.metadata[i][1], pre)
    with (
        read_gguf(write_gguf(tmp_path / "p.gguf", model.spec)) as g,
        pytest.raises(
            GGUFError,
            match=rf"tokenizer\.ggml\.pre is '{pre}', a pre-tokenizer keel does not reproduce; "
            r"supported: gpt2, default, smollm",
        ),
    ):
        build_tokenizer(g)


@pytest.mark.parametrize("pre", ["gpt2", None])
def test_gpt2_or_absent_pre_tokenizer_splits_like_gpt2(tmp_path, pre):
    from keel.gguf.tokenizer import build_tokenizer

    model = tiny_llama()
    i = next(n for n, (k, _, _) in enumerate(model.spec.metadata) if k == "tokenizer.ggml.pre")
    if pre is None:
        del model.spec.metadata[i]
    else:
        model.spec.metadata[i] = ("tokenizer.ggml.pre", model.spec.metadata[i][1], pre)
    with read_gguf(write_gguf(tmp_path / "g.gguf", model.spec)) as g:
        tok = build_tokenizer(g).tokenizer
    assert tok.pre_tokenizer.pre_tokenize_str("ab 42") == [("ab", (0, 2)), ("Ġ42", (2, 5))]  # digits kept together
