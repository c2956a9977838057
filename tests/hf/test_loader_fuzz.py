"""A small fixed sample of the loader fuzzer (`python -m keel_fuzz.loaders` runs all of it, a few hundred mutations):
every mutated checkpoint loads, or fails with a keel error that names the file and the field."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest
from keel_fuzz.loaders import Mutation, gguf_mutations, hf_mutations
from keel_fuzz.loaders import harness as loader_fuzz
from support.smollm2 import needs_smollm2


def sample(mutations: list[Mutation], n: int, seed: int) -> list[Mutation]:
    """`n` mutations spread over the files they break (round-robin over a seeded shuffle of each file's)."""
    rng = random.Random(seed)
    by_file: dict[str, list[Mutation]] = defaultdict(list)
    for m in mutations:
        by_file[m.file].append(m)
    for group in by_file.values():
        rng.shuffle(group)
    out: list[Mutation] = []
    while len(out) < n and any(by_file.values()):
        for group in by_file.values():
            if group and len(out) < n:
                out.append(group.pop())
    return out


def test_classifier_tells_clear_from_unclear():
    m = Mutation("x", "hf", "config.json", ("hidden_size",), "json_set")

    class ConfigError(ValueError):
        pass

    assert loader_fuzz.classify(ConfigError("config.json: hidden_size must be ..."), m) == "clear"
    assert loader_fuzz.classify(ConfigError("hidden_size must be ..."), m) == "unclear"  # no file
    assert loader_fuzz.classify(ConfigError("config.json: bad value"), m) == "unclear"  # no field
    assert loader_fuzz.classify(TypeError("config.json: hidden_size"), m) == "unclear"  # not keel's error family
    legit = Mutation("y", "hf", "config.json", (), "json_set")
    assert loader_fuzz.classify(ConfigError("config.json: hidden_size"), legit) == "refused"


@pytest.mark.slow  # 38 mutated checkpoints, each loaded in a worker process
def test_tiny_checkpoint_sample_has_no_defects(tiny_hf, tiny_gguf, tmp_path):
    mutations = sample(hf_mutations(tiny_hf), 26, seed=1) + sample(gguf_mutations(tiny_gguf), 12, seed=2)
    report = loader_fuzz.fuzz(mutations, tiny_hf, tiny_gguf, tmp_path, timeout=120)
    assert report.counts["clear"] > 15 and report.counts["load"] > 0, report.summary()
    assert not report.defects, report.summary()


# mutations of the real SmolLM2 files that once gave unclear errors or allocated before failing
REAL = (
    "config.json:vocab_size=huge",
    "config.json:num_hidden_layers=huge",
    "config.json:rms_norm_eps=list",
    "config.json:num_key_value_heads=true",
    "config.json:vocab_size=49153",
    "model.safetensors:model.embed_tokens.weight.data_offsets=grow",
    "model.safetensors:header-length=2^63",
    "model.safetensors:truncate-body-0.5",
    "tokenizer.json:model.vocab.Ben=beyond",
    "tokenizer_config.json:chat_template=bad-jinja",
    "gguf:llama.embedding_length=u32-array",
    "gguf:tokens=count+1",
    "gguf:blk.0.attn_q.weight.type=F32",
    "gguf:truncate-at-mid-data",
)


@pytest.mark.slow  # the real 135M model, each mutation loaded in a worker
@needs_smollm2
def test_real_smollm2_sample_has_no_defects(smollm2_fp32, tmp_path):
    from support.smollm2 import GGUF

    assert GGUF is not None
    every = {m.id: m for m in [*hf_mutations(smollm2_fp32), *gguf_mutations(GGUF)]}
    report = loader_fuzz.fuzz([every[i] for i in REAL], smollm2_fp32, GGUF, tmp_path, timeout=120)
    assert report.counts["clear"] == len(REAL), report.summary()


@pytest.mark.parametrize("target", ["hf", "gguf"])
def test_mutations_are_many_and_distinct(tiny_hf, tiny_gguf, target):
    muts = hf_mutations(tiny_hf) if target == "hf" else gguf_mutations(tiny_gguf)
    assert len(muts) > 250 and len({m.id for m in muts}) == len(muts)
