"""Model shapes: every family teams serve known by name, each held to its model card, and any
other model read from its own config.json; never another model's shape."""
from __future__ import annotations

import json

import pytest

from config.models import (
    KNOWN_MODELS, MXFP4_BITS, UNMODELLED, ModelShape, known_model, shape_from_config,
    shape_from_config_json,
)

# Total parameters as each model card (or the Hub's safetensors count) states them, in
# billions: an independent check on the config.json figures in config/models.py.
CARD_PARAMS_B = {
    "Llama-3-8B": 8.03, "Llama-3-70B": 70.6, "Llama-3.1-8B": 8.03, "Llama-3.1-70B": 70.6,
    "Llama-3.1-405B": 405.9, "Llama-3.2-1B": 1.24, "Llama-3.2-3B": 3.21, "Llama-3.3-70B": 70.6,
    "Qwen2.5-0.5B": 0.49, "Qwen2.5-1.5B": 1.54, "Qwen2.5-3B": 3.09, "Qwen2.5-7B": 7.61,
    "Qwen2.5-14B": 14.7, "Qwen2.5-32B": 32.5, "Qwen2.5-72B": 72.7,
    "Qwen3-0.6B": 0.6, "Qwen3-1.7B": 1.7, "Qwen3-4B": 4.0, "Qwen3-8B": 8.2, "Qwen3-14B": 14.8,
    "Qwen3-32B": 32.8, "Qwen3-30B-A3B": 30.5, "Qwen3-235B-A22B": 235,
    "Mistral-7B": 7.25, "Mistral-Nemo": 12.2, "Mistral-Small-22B": 22.2,
    "Mistral-Small-24B": 23.6, "Mistral-Large": 123, "Mixtral-8x7B": 46.7, "Mixtral-8x22B": 141,
    "DeepSeek-R1-Distill-Qwen-1.5B": 1.78, "DeepSeek-R1-Distill-Qwen-7B": 7.62,
    "DeepSeek-R1-Distill-Qwen-14B": 14.8, "DeepSeek-R1-Distill-Qwen-32B": 32.8,
    "DeepSeek-R1-Distill-Llama-8B": 8.03, "DeepSeek-R1-Distill-Llama-70B": 70.6,
    "DeepSeek-R1-0528-Qwen3-8B": 8.19, "gpt-oss-20b": 21, "gpt-oss-120b": 117,
}
# Active parameters per token the cards state for the mixtures of experts.
CARD_ACTIVE_B = {"Qwen3-30B-A3B": 3.3, "Qwen3-235B-A22B": 22, "Mixtral-8x7B": 12.9,
                 "Mixtral-8x22B": 39, "gpt-oss-20b": 3.6, "gpt-oss-120b": 5.1}
SHAPES = sorted(KNOWN_MODELS.values(), key=lambda m: m.name)


def config_json(m: ModelShape) -> dict:
    """The config.json a model of shape `m` publishes (the keys transformers writes)."""
    c = {"architectures": ["SomethingForCausalLM"], "hidden_size": m.hidden,
         "num_hidden_layers": m.layers, "num_attention_heads": m.heads,
         "num_key_value_heads": m.kv_heads, "head_dim": m.head_dim,
         "intermediate_size": m.intermediate, "vocab_size": m.vocab,
         "tie_word_embeddings": m.tied, "torch_dtype": "bfloat16", "rope_theta": 1e6,
         "max_position_embeddings": 131072, "use_sliding_window": False,
         "sliding_window": 131072}
    if m.experts:
        c.update(num_local_experts=m.experts, num_experts_per_tok=m.experts_per_token)
        if m.expert_intermediate:
            c["moe_intermediate_size"] = m.expert_intermediate
    if m.sliding_layers:
        c.update(use_sliding_window=True, sliding_window=m.sliding_window,
                 layer_types=["sliding_attention", "full_attention"] * (m.layers // 2))
    if m.expert_weight_bits:
        c["quantization_config"] = {"quant_method": "mxfp4"}
    return c


def test_every_family_and_size_is_known_and_held_to_its_model_card():
    assert set(CARD_PARAMS_B) == {m.name for m in SHAPES}
    for m in SHAPES:
        assert m.params / 1e9 == pytest.approx(CARD_PARAMS_B[m.name], rel=0.02), m.name
        active = m.layers * m.active_layer_params + m.vocab * m.hidden   # + the LM head
        assert (m.name in CARD_ACTIVE_B) == bool(m.experts), m.name
        if m.experts:   # cards count the input embedding in, or not: within 10%
            assert active / 1e9 == pytest.approx(CARD_ACTIVE_B[m.name], rel=0.1), m.name
        assert m.kv_bytes_per_token == 2 * m.layers * m.kv_heads * m.head_dim * 2
        assert m.prefill_flops_per_token(65536) > m.prefill_flops_per_token(8192) > 0


def test_each_model_is_found_by_the_names_it_is_published_under():
    for m in SHAPES:
        repo = m.source.removeprefix("huggingface.co/").split("/blob/")[0]
        for name in (repo, m.name, m.name.lower(), f"{repo}-Instruct"):
            assert known_model(name) is m, name
    for name, shape in [("meta-llama/Meta-Llama-3.1-8B-Instruct", "Llama-3.1-8B"),
                        ("Meta-Llama-3-70B-Instruct", "Llama-3-70B"),
                        ("Qwen/Qwen3-30B-A3B-Instruct-2507", "Qwen3-30B-A3B"),
                        ("Qwen/Qwen3-4B-Thinking-2507", "Qwen3-4B"),
                        ("mistralai/Mistral-Small-3.1-24B-Instruct-2503", "Mistral-Small-24B"),
                        ("mistralai/Mistral-Large-Instruct-2411", "Mistral-Large"),
                        ("mistralai/Mistral-7B-Instruct-v0.2", "Mistral-7B"),
                        ("Qwen/Qwen2.5-Coder-32B-Instruct", "Qwen2.5-32B")]:
        assert known_model(name) is KNOWN_MODELS[shape.lower()], name
    # a quantized checkpoint's weights are not its base's; a model we do not know is None
    for name in ("Qwen2.5-32B-Instruct-AWQ", "Llama-3.1-8B-Instruct-FP8", "my-own-finetune",
                 "Qwen2.5-33B", "Llama-3.1-8"):
        assert known_model(name) is None, name


@pytest.mark.parametrize("m", SHAPES, ids=lambda m: m.name)
def test_a_models_own_config_json_gives_its_shape(m):
    """What synth reads from a recorded config.json is what it knows by name."""
    read = shape_from_config_json(m.name, json.loads(json.dumps(config_json(m))), "x.json")
    assert (read.kv_bytes_per_token, read.params, read.weight_bytes) == (
        m.kv_bytes_per_token, m.params, m.weight_bytes)
    for prefix in (1024, 8192, 65536):
        assert read.prefill_flops_per_token(prefix) == pytest.approx(
            m.prefill_flops_per_token(prefix))


def test_config_json_variants_synth_reads():
    llama = KNOWN_MODELS["llama-3.1-8b"]
    base = config_json(llama)
    # a multimodal model's text_config; the newer `dtype` key; float32 served in 16 bits
    nested = shape_from_config_json("x", {"model_type": "mistral3", "torch_dtype": "bfloat16",
                                          "text_config": {**base, "torch_dtype": None}}, "x")
    assert nested.kv_bytes_per_token == llama.kv_bytes_per_token
    f32 = {k: v for k, v in base.items() if k != "torch_dtype"} | {"dtype": "float32"}
    assert shape_from_config_json("x", f32, "x").dtype_bytes == 2
    # Mistral 7B v0.1: a 4096-token window on every layer, cheaper at 64K, same KV
    windowed = shape_from_config_json("x", {**base, "use_sliding_window": None,
                                            "sliding_window": 4096}, "x")
    assert windowed.sliding_layers == llama.layers
    assert windowed.prefill_flops_per_token(65536) < llama.prefill_flops_per_token(65536)
    assert windowed.prefill_flops_per_token(4096) == llama.prefill_flops_per_token(4096)
    fp8 = shape_from_config_json("x", {**base, "quantization_config": {"quant_method": "fp8"}},
                                 "x")
    assert fp8.weight_bytes == pytest.approx(llama.params)
    assert fp8.kv_bytes_per_token == llama.kv_bytes_per_token
    gpt = KNOWN_MODELS["gpt-oss-120b"]
    assert gpt.weight_bytes < gpt.params * (MXFP4_BITS / 8 + 0.1)


@pytest.mark.parametrize("key", sorted(UNMODELLED))
def test_a_shape_the_formulas_do_not_hold_for_is_one_line_naming_the_key(key):
    config = {**config_json(KNOWN_MODELS["qwen3-8b"]), key: 2}
    with pytest.raises(ValueError, match=rf"^{key}: a shape the L2 verdict models"):
        shape_from_config_json("x", config, "x")
    with pytest.raises(ValueError, match=rf"^{key}: "):
        shape_from_config("x", config_json(KNOWN_MODELS["qwen3-8b"]) | {key: 2})


@pytest.mark.parametrize("fields, key", [
    ({"num_local_experts": 8}, "num_experts_per_tok"),
    ({"num_experts_per_tok": 2}, "num_experts"),
    ({"num_experts": 2, "num_experts_per_tok": 4}, "num_experts_per_tok"),
    ({"hidden_size": True}, "hidden_size"), ({"torch_dtype": "int4"}, "torch_dtype"),
])
def test_impossible_config_keys_name_the_key(fields, key):
    base = {k: v for k, v in config_json(KNOWN_MODELS["qwen3-8b"]).items()
            if k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "vocab_size")}
    with pytest.raises(ValueError, match=rf"^{key}: "):
        shape_from_config("x", {**base, **fields})
