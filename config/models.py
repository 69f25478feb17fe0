"""Model shapes: the KV bytes and the prefill FLOPs of a token, from a model's config.json.

Why: whether a shared L2 can pay depends on how many bytes of KV a token has against how much
compute recomputing it costs (k8s/l2.py), and both follow from the model's shape alone. A dense
decoder's prefill computes 2 FLOPs per weight of its layers for every prompt token (the
embedding is a lookup and vLLM computes the LM head for the last token only), plus attention:
a token at position i attends over i earlier ones, 4 x (query width) x i FLOPs per layer, so a
prefix of L tokens costs 2 x layers x (query width) x L per token on average. Biases and norms
are under 0.1% of the weights and left out. Mixture-of-experts models compute with a part of
their weights per token and are not modelled.

An endpoint file names a model we know (`modelName`, or `kvCacheSpec.modelShape: <name>`), or
states the shape with config.json's own keys (`kvCacheSpec.modelShape: {hidden_size: ...}`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int                  # hidden_size
    layers: int                  # num_hidden_layers
    heads: int                   # num_attention_heads
    kv_heads: int                # num_key_value_heads
    head_dim: int                # head_dim (hidden / heads where config.json has none)
    intermediate: int            # intermediate_size (gated MLP: 3 matrices)
    vocab: int                   # vocab_size
    tied: bool = False           # tie_word_embeddings
    dtype_bytes: int = 2         # of the KV cache (vLLM's default: the model's dtype)
    source: str = ""             # where the figures come from

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def layer_params(self) -> int:
        """Weights of one decoder layer: q, k, v, o projections and the gated MLP."""
        kv = self.kv_heads * self.head_dim
        return (self.hidden * (self.q_dim + 2 * kv) + self.q_dim * self.hidden
                + 3 * self.hidden * self.intermediate)

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.vocab * self.hidden * (1 if self.tied
                                                                             else 2)

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer: 2 x layers x KV heads x head dim x bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def prefill_flops_per_token(self, prefix_tokens: int) -> float:
        """FLOPs per token of a prefill of `prefix_tokens` (the module docstring)."""
        return 2 * self.layers * self.layer_params + 2 * self.layers * self.q_dim * prefix_tokens


def _hf(repo: str) -> str:
    return f"huggingface.co/{repo}/blob/main/config.json"


KNOWN_MODELS: dict[str, ModelShape] = {m.name.lower(): m for m in (
    ModelShape("Llama-3.1-8B", 4096, 32, 32, 8, 128, 14336, 128256,
               source=_hf("meta-llama/Llama-3.1-8B")),
    ModelShape("Llama-3.1-70B", 8192, 80, 64, 8, 128, 28672, 128256,
               source=_hf("meta-llama/Llama-3.1-70B")),
    ModelShape("Llama-3.3-70B", 8192, 80, 64, 8, 128, 28672, 128256,
               source=_hf("meta-llama/Llama-3.3-70B-Instruct")),
    ModelShape("Llama-3.2-3B", 3072, 28, 24, 8, 128, 8192, 128256, tied=True,
               source=_hf("meta-llama/Llama-3.2-3B")),
    ModelShape("Llama-3.2-1B", 2048, 16, 32, 8, 64, 8192, 128256, tied=True,
               source=_hf("meta-llama/Llama-3.2-1B")),
    ModelShape("Qwen3-8B", 4096, 36, 32, 8, 128, 12288, 151936, source=_hf("Qwen/Qwen3-8B")),
    ModelShape("Qwen3-14B", 5120, 40, 40, 8, 128, 17408, 151936,
               source=_hf("Qwen/Qwen3-14B")),
    ModelShape("Qwen3-32B", 5120, 64, 64, 8, 128, 25600, 151936,
               source=_hf("Qwen/Qwen3-32B")),
    ModelShape("Qwen2.5-7B", 3584, 28, 28, 4, 128, 18944, 152064,
               source=_hf("Qwen/Qwen2.5-7B-Instruct")),
    ModelShape("Qwen2.5-72B", 8192, 80, 64, 8, 128, 29568, 152064,
               source=_hf("Qwen/Qwen2.5-72B-Instruct")),
    ModelShape("Mistral-7B", 4096, 32, 32, 8, 128, 14336, 32768,
               source=_hf("mistralai/Mistral-7B-Instruct-v0.3")),
)}
# What the L2 verdict assumes for a model it cannot name: of the shapes above, the one whose
# KV is dearest to read against its compute at 8K (bytes per FLOP), so an unknown model is
# never judged kinder than the worst case we know.
ASSUMED = max(KNOWN_MODELS.values(),
              key=lambda m: m.kv_bytes_per_token / m.prefill_flops_per_token(8192))

_SUFFIXES = re.compile(r"(-instruct|-chat|-it|-base|-hf|-fp8|-awq|-gptq|-v0\.\d+)+$")


def known_model(name: str) -> ModelShape | None:
    """The shape of a model named as endpoint files name them (`meta-llama/Llama-3.1-8B-
    Instruct`, `Llama-3.1-8B-Instruct`, `llama-3.1-8b`), or None."""
    base = name.rsplit("/", 1)[-1].lower()
    return KNOWN_MODELS.get(base) or KNOWN_MODELS.get(_SUFFIXES.sub("", base))


# config.json keys an endpoint file may state (kvCacheSpec.modelShape), and what they become
CONFIG_KEYS = {"hidden_size": "hidden", "num_hidden_layers": "layers",
               "num_attention_heads": "heads", "num_key_value_heads": "kv_heads",
               "head_dim": "head_dim", "intermediate_size": "intermediate",
               "vocab_size": "vocab"}
OPTIONAL_KEYS = ("head_dim", "num_key_value_heads", "tie_word_embeddings", "torch_dtype")
MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")


def shape_from_config(name: str, fields: Mapping[str, Any]) -> ModelShape:
    """A ModelShape from config.json's keys; raises ValueError naming the key and what is
    allowed (the endpoint reader turns it into a ConfigError)."""
    unknown = sorted(set(fields) - set(CONFIG_KEYS) - set(OPTIONAL_KEYS) - set(MOE_KEYS))
    if unknown:
        raise ValueError(f"{unknown[0]}: config.json keys: "
                         + ", ".join(sorted({*CONFIG_KEYS, *OPTIONAL_KEYS})))
    moe = [k for k in MOE_KEYS if k in fields]
    if moe:
        raise ValueError(f"{moe[0]}: a dense model (mixture-of-experts models compute with a "
                         "part of their weights per token, which the L2 verdict does not model)")
    values: dict[str, Any] = {}
    for key, attr in CONFIG_KEYS.items():
        if key not in fields:
            continue
        v = fields[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{key}: a positive integer, not {v!r}")
        values[attr] = v
    missing = [k for k in CONFIG_KEYS if CONFIG_KEYS[k] not in values
               and k not in OPTIONAL_KEYS]
    if missing:
        raise ValueError(f"{missing[0]}: required (with " + ", ".join(
            k for k in CONFIG_KEYS if k not in OPTIONAL_KEYS) + ")")
    values.setdefault("kv_heads", values["heads"])
    values.setdefault("head_dim", values["hidden"] // values["heads"])
    tied = fields.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise ValueError(f"tie_word_embeddings: true or false, not {tied!r}")
    dtype = fields.get("torch_dtype", "bfloat16")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"torch_dtype: one of {', '.join(DTYPE_BYTES)}, not {dtype!r}")
    return ModelShape(name, tied=tied, dtype_bytes=DTYPE_BYTES[dtype],
                      source="the endpoint file (kvCacheSpec.modelShape)", **values)
