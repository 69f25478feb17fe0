"""Model shapes: the KV bytes and the prefill FLOPs of a token, from a model's config.json.

Why: whether a shared L2 can pay depends on how many bytes of KV a token has against how much
compute recomputing it costs (k8s/l2.py), and both follow from the model's shape alone; the
weights' size says how much of the GPUs is left for KV. A decoder's prefill computes 2 FLOPs
per weight a token passes through (the embedding is a lookup and vLLM computes the LM head for
the last token only): every weight of a dense layer, the attention and the `experts_per_token`
experts the router picks of a mixture-of-experts layer. Plus attention: a token at position i
attends over i earlier ones (at most the window, in a sliding-window layer), 4 x (query width)
x i FLOPs per layer, so a prefix of L tokens costs 2 x (query width) x L per token and full
layer on average. Biases, norms and routers' softmax are under 0.1% of the weights and left
out. The KV of every layer counts in full, sliding-window layers' too: with a KV connector
(LMCache) vLLM keeps and stores every layer's KV for every token.

Where a shape comes from, in this order (config/endpoint_spec.py):
1. the endpoint file's `kvCacheSpec.modelShape`: config.json's keys inline, the path of a copy
   of the model's config.json in the repository, or a name we know;
2. the model's own config.json recorded by `python -m tools upload-model` at
   `models/<modelLocation>/config.json` (RECORDED), a file the team commits;
3. `modelName`, where it names a model below.
A model none of these gives is one line naming what to provide (k8s/serving.py), never another
model's shape.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

# vLLM's dtype "auto" serves a float32 checkpoint in 16 bits (config/model.py _get_and_verify_dtype)
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 2, "float8_e4m3fn": 1}
# Where upload-model records an uploaded model's config.json, by the S3 prefix it went to (the
# endpoint's modelLocation), and where synth looks for it: the team's file, not our source.
RECORDED = "models/{location}/config.json"
MXFP4_BITS = 4.25    # 4-bit values and one 8-bit scale per 32 (OCP MX), gpt-oss's experts


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
    dtype_bytes: int = 2         # of the weights and the KV cache (vLLM's default: the model's)
    source: str = ""             # where the figures come from
    experts: int = 0             # num_experts / num_local_experts (0: a dense model)
    experts_per_token: int = 0   # num_experts_per_tok / experts_per_token
    expert_intermediate: int = 0   # moe_intermediate_size (0: intermediate_size)
    sliding_window: int = 0      # sliding_window of the layers that have one
    sliding_layers: int = 0      # how many layers attend within it (layer_types)
    weight_bits: float = 0.0     # quantized weights (quantization_config); 0: dtype_bytes
    expert_weight_bits: float = 0.0   # quantized experts (gpt-oss: MXFP4); 0: as the rest

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def attention_params(self) -> int:
        """q, k, v and o projections of one layer."""
        kv = self.kv_heads * self.head_dim
        return self.hidden * (self.q_dim + 2 * kv) + self.q_dim * self.hidden

    @property
    def mlp_params(self) -> int:
        """One gated MLP (an expert's, in a mixture-of-experts layer): 3 matrices."""
        return 3 * self.hidden * (self.expert_intermediate or self.intermediate)

    @property
    def layer_params(self) -> int:
        """Weights of one decoder layer: the attention, every expert (or the MLP), the router."""
        return (self.attention_params + max(self.experts, 1) * self.mlp_params
                + self.hidden * self.experts)

    @property
    def active_layer_params(self) -> int:
        """Weights of one layer a token passes through: the router's picks only."""
        return (self.attention_params + (self.experts_per_token or 1) * self.mlp_params
                + self.hidden * self.experts)

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.vocab * self.hidden * (1 if self.tied
                                                                             else 2)

    @property
    def weight_bytes(self) -> float:
        """What the weights take on the GPUs."""
        rest = self.weight_bits / 8 or self.dtype_bytes
        experts = self.layers * self.experts * self.mlp_params if self.expert_weight_bits else 0
        return (self.params - experts) * rest + experts * self.expert_weight_bits / 8

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer: 2 x layers x KV heads x head dim x bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def prefill_flops_per_token(self, prefix_tokens: int) -> float:
        """FLOPs per token of a prefill of `prefix_tokens` (the module docstring)."""
        full = self.layers - self.sliding_layers
        window = self.sliding_window
        # mean over the prefix of min(i, window), x 2 for the mean's own halving above
        sliding = (prefix_tokens if prefix_tokens <= window
                   else 2 * window - window * window / prefix_tokens)
        return (2 * self.layers * self.active_layer_params
                + 2 * self.q_dim * (full * prefix_tokens + self.sliding_layers * sliding))


def _hf(repo: str) -> str:
    return f"huggingface.co/{repo}/blob/main/config.json"


def _dense(name: str, repo: str, hidden: int, layers: int, heads: int, kv_heads: int,
           intermediate: int, vocab: int, *, head_dim: int = 0, tied: bool = False
           ) -> ModelShape:
    return ModelShape(name, hidden, layers, heads, kv_heads, head_dim or hidden // heads,
                      intermediate, vocab, tied=tied, source=_hf(repo))


# The families teams serve, each size with the values of its published config.json (the repo
# named in `source`; a base model and its -Instruct share them). Written without access to the
# Hub: Qwen 2.5 (0.5B-3B, 32B), Qwen 3 (0.6B-4B, the two MoE), Mistral Small 24B and gpt-oss
# were checked against copies of their config.json in public code; every entry's parameter
# count (and the MoE's active count) is held to its model card's in tests/config/
# test_models.py, which catches a wrong width, depth or vocabulary.
_LLAMA = (   # meta-llama/*: Llama 3, 3.1, 3.2 (text), 3.3
    _dense("Llama-3-8B", "meta-llama/Meta-Llama-3-8B", 4096, 32, 32, 8, 14336, 128256),
    _dense("Llama-3-70B", "meta-llama/Meta-Llama-3-70B", 8192, 80, 64, 8, 28672, 128256),
    _dense("Llama-3.1-8B", "meta-llama/Llama-3.1-8B", 4096, 32, 32, 8, 14336, 128256),
    _dense("Llama-3.1-70B", "meta-llama/Llama-3.1-70B", 8192, 80, 64, 8, 28672, 128256),
    _dense("Llama-3.1-405B", "meta-llama/Llama-3.1-405B", 16384, 126, 128, 8, 53248, 128256),
    _dense("Llama-3.2-1B", "meta-llama/Llama-3.2-1B", 2048, 16, 32, 8, 8192, 128256,
           head_dim=64, tied=True),
    _dense("Llama-3.2-3B", "meta-llama/Llama-3.2-3B", 3072, 28, 24, 8, 8192, 128256,
           tied=True),
    _dense("Llama-3.3-70B", "meta-llama/Llama-3.3-70B-Instruct", 8192, 80, 64, 8, 28672,
           128256),
)
_QWEN25 = (   # Qwen/Qwen2.5-*: every published size (use_sliding_window false in each)
    _dense("Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B-Instruct", 896, 24, 14, 2, 4864, 151936,
           tied=True),
    _dense("Qwen2.5-1.5B", "Qwen/Qwen2.5-1.5B-Instruct", 1536, 28, 12, 2, 8960, 151936,
           tied=True),
    _dense("Qwen2.5-3B", "Qwen/Qwen2.5-3B-Instruct", 2048, 36, 16, 2, 11008, 151936,
           tied=True),
    _dense("Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct", 3584, 28, 28, 4, 18944, 152064),
    _dense("Qwen2.5-14B", "Qwen/Qwen2.5-14B-Instruct", 5120, 48, 40, 8, 13824, 152064),
    _dense("Qwen2.5-32B", "Qwen/Qwen2.5-32B-Instruct", 5120, 64, 40, 8, 27648, 152064),
    _dense("Qwen2.5-72B", "Qwen/Qwen2.5-72B-Instruct", 8192, 80, 64, 8, 29568, 152064),
)
_QWEN3 = (   # Qwen/Qwen3-*: every published size, dense (head_dim 128) and mixture-of-experts
    _dense("Qwen3-0.6B", "Qwen/Qwen3-0.6B", 1024, 28, 16, 8, 3072, 151936, head_dim=128,
           tied=True),
    _dense("Qwen3-1.7B", "Qwen/Qwen3-1.7B", 2048, 28, 16, 8, 6144, 151936, head_dim=128,
           tied=True),
    _dense("Qwen3-4B", "Qwen/Qwen3-4B", 2560, 36, 32, 8, 9728, 151936, head_dim=128,
           tied=True),
    _dense("Qwen3-8B", "Qwen/Qwen3-8B", 4096, 36, 32, 8, 12288, 151936, head_dim=128),
    _dense("Qwen3-14B", "Qwen/Qwen3-14B", 5120, 40, 40, 8, 17408, 151936, head_dim=128),
    _dense("Qwen3-32B", "Qwen/Qwen3-32B", 5120, 64, 64, 8, 25600, 151936, head_dim=128),
    ModelShape("Qwen3-30B-A3B", 2048, 48, 32, 4, 128, 6144, 151936, experts=128,
               experts_per_token=8, expert_intermediate=768, source=_hf("Qwen/Qwen3-30B-A3B")),
    ModelShape("Qwen3-235B-A22B", 4096, 94, 64, 4, 128, 12288, 151936, experts=128,
               experts_per_token=8, expert_intermediate=1536,
               source=_hf("Qwen/Qwen3-235B-A22B")),
)
_MISTRAL = (   # mistralai/*: Mistral 7B, NeMo, Small (22B and the 24B of Small 3.x), Large 2;
    # Mixtral (mixture-of-experts: intermediate_size is each expert's)
    _dense("Mistral-7B", "mistralai/Mistral-7B-Instruct-v0.3", 4096, 32, 32, 8, 14336, 32768),
    _dense("Mistral-Nemo", "mistralai/Mistral-Nemo-Instruct-2407", 5120, 40, 32, 8, 14336,
           131072, head_dim=128),
    _dense("Mistral-Small-22B", "mistralai/Mistral-Small-Instruct-2409", 6144, 56, 48, 8,
           16384, 32768),
    _dense("Mistral-Small-24B", "mistralai/Mistral-Small-24B-Instruct-2501", 5120, 40, 32, 8,
           32768, 131072, head_dim=128),
    _dense("Mistral-Large", "mistralai/Mistral-Large-Instruct-2407", 12288, 88, 96, 8, 28672,
           32768),
    ModelShape("Mixtral-8x7B", 4096, 32, 32, 8, 128, 14336, 32000, experts=8,
               experts_per_token=2, source=_hf("mistralai/Mixtral-8x7B-Instruct-v0.1")),
    ModelShape("Mixtral-8x22B", 6144, 56, 48, 8, 128, 16384, 32768, experts=8,
               experts_per_token=2, source=_hf("mistralai/Mixtral-8x22B-Instruct-v0.1")),
)
_DEEPSEEK = (   # deepseek-ai/DeepSeek-R1-Distill-*: the shapes of the bases they were tuned from
    _dense("DeepSeek-R1-Distill-Qwen-1.5B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", 1536,
           28, 12, 2, 8960, 151936),
    _dense("DeepSeek-R1-Distill-Qwen-7B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", 3584, 28,
           28, 4, 18944, 152064),
    _dense("DeepSeek-R1-Distill-Qwen-14B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B", 5120,
           48, 40, 8, 13824, 152064),
    _dense("DeepSeek-R1-Distill-Qwen-32B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", 5120,
           64, 40, 8, 27648, 152064),
    _dense("DeepSeek-R1-Distill-Llama-8B", "deepseek-ai/DeepSeek-R1-Distill-Llama-8B", 4096,
           32, 32, 8, 14336, 128256),
    _dense("DeepSeek-R1-Distill-Llama-70B", "deepseek-ai/DeepSeek-R1-Distill-Llama-70B", 8192,
           80, 64, 8, 28672, 128256),
    _dense("DeepSeek-R1-0528-Qwen3-8B", "deepseek-ai/DeepSeek-R1-0528-Qwen3-8B", 4096, 36, 32,
           8, 12288, 151936, head_dim=128),
)
_GPT_OSS = (   # openai/gpt-oss-*: experts in MXFP4, every other layer a 128-token window
    ModelShape("gpt-oss-20b", 2880, 24, 64, 8, 64, 2880, 201088, experts=32,
               experts_per_token=4, sliding_window=128, sliding_layers=12,
               expert_weight_bits=MXFP4_BITS, source=_hf("openai/gpt-oss-20b")),
    ModelShape("gpt-oss-120b", 2880, 36, 64, 8, 64, 2880, 201088, experts=128,
               experts_per_token=4, sliding_window=128, sliding_layers=18,
               expert_weight_bits=MXFP4_BITS, source=_hf("openai/gpt-oss-120b")),
)
KNOWN_MODELS: dict[str, ModelShape] = {m.name.lower(): m for m in (
    *_LLAMA, *_QWEN25, *_QWEN3, *_MISTRAL, *_DEEPSEEK, *_GPT_OSS)}
# Other published names of the same weights' shapes
ALIASES = {
    "mistral-small": "mistral-small-22b",            # Mistral-Small-Instruct-2409
    "mistral-small-3.1-24b": "mistral-small-24b",    # its text model
    "mistral-small-3.2-24b": "mistral-small-24b",
    "mistral-large-2": "mistral-large",
    **{f"qwen2.5-coder-{s}": f"qwen2.5-{s}" for s in ("7b", "14b", "32b")},
}
FAMILIES = "Llama 3.x, Qwen 2.5, Qwen 3, Mistral, Mixtral, DeepSeek-R1 distills, gpt-oss"

# What a published name adds to the model's: chat and base variants, release dates, revisions.
_SUFFIXES = re.compile(r"(-instruct|-chat|-it|-base|-hf|-v0\.\d+|-\d{4}|-thinking)+$")


def known_model(name: str) -> ModelShape | None:
    """The shape of a model named as endpoint files name them (`meta-llama/Llama-3.1-8B-
    Instruct`, `Meta-Llama-3-8B-Instruct`, `Qwen3-30B-A3B-Instruct-2507`, `llama-3.1-8b`), or
    None. A quantized checkpoint's name (-AWQ, -FP8...) is not its base model's shape: its
    weights differ; its config.json says how."""
    base = name.rsplit("/", 1)[-1].lower()
    for candidate in (base, _SUFFIXES.sub("", base)):
        candidate = candidate.removeprefix("meta-")
        candidate = ALIASES.get(candidate, candidate)
        if candidate in KNOWN_MODELS:
            return KNOWN_MODELS[candidate]
    return None


# config.json keys an endpoint file may state (kvCacheSpec.modelShape), and what they become
CONFIG_KEYS = {"hidden_size": "hidden", "num_hidden_layers": "layers",
               "num_attention_heads": "heads", "num_key_value_heads": "kv_heads",
               "head_dim": "head_dim", "intermediate_size": "intermediate",
               "vocab_size": "vocab"}
MOE_KEYS = {"num_experts": "experts", "num_local_experts": "experts",
            "num_experts_per_tok": "experts_per_token", "experts_per_token": "experts_per_token",
            "moe_intermediate_size": "expert_intermediate"}
OPTIONAL_KEYS = ("head_dim", "num_key_value_heads", "tie_word_embeddings", "torch_dtype",
                 "dtype", *MOE_KEYS)
# Keys of shapes the formulas above do not hold for: one line naming the key, never a guess.
UNMODELLED = {
    "kv_lora_rank": "multi-head latent attention (DeepSeek-V2/V3/R1) caches a compressed KV",
    "n_routed_experts": "DeepSeek's mixture of experts has shared experts and dense layers",
    "n_shared_experts": "shared experts beside the routed ones",
    "shared_expert_intermediate_size": "shared experts beside the routed ones",
    "mlp_only_layers": "dense layers between the mixture-of-experts ones",
    "intermediate_size_mlp": "Llama 4's dense layers and shared expert beside the routed ones",
}


def shape_from_config(name: str, fields: Mapping[str, Any], source: str =
                      "the endpoint file (kvCacheSpec.modelShape)") -> ModelShape:
    """A ModelShape from config.json's keys stated in an endpoint file, strictly: a key we do
    not read is refused. Raises ValueError `key: allowed` (the reader makes a ConfigError)."""
    unknown = sorted(set(fields) - set(CONFIG_KEYS) - set(OPTIONAL_KEYS))
    if unknown:
        key = next((k for k in unknown if k in UNMODELLED), unknown[0])
        why = UNMODELLED.get(key)
        raise ValueError(f"{key}: " + (
            f"a shape the L2 verdict models ({why} here)" if why else "config.json keys: "
            + ", ".join(sorted({*CONFIG_KEYS, *OPTIONAL_KEYS}))))
    return _shape(name, fields, source)


def shape_from_config_json(name: str, config: Mapping[str, Any], source: str) -> ModelShape:
    """A ModelShape from a model's whole config.json (recorded by upload-model, or a copy the
    endpoint file points at): the keys the shape needs, a multimodal model's `text_config`,
    its sliding-window layers and quantized experts; other keys are the model's own business.
    Raises ValueError `key: allowed`."""
    if not isinstance(config, Mapping):
        raise ValueError("<file>: a JSON object (a model's config.json)")
    text = config.get("text_config")
    if isinstance(text, Mapping):
        config = {**{k: v for k, v in config.items() if k in ("torch_dtype", "dtype")}, **text}
    for key, why in UNMODELLED.items():
        if config.get(key):
            raise ValueError(f"{key}: a shape the L2 verdict models ({why} here); state one "
                             "it does with kvCacheSpec.modelShape's config.json keys")
    fields = {k: config[k] for k in (*CONFIG_KEYS, *OPTIONAL_KEYS) if k in config}
    shape = _shape(name, fields, source)
    window = config.get("sliding_window")
    if config.get("use_sliding_window") is not False and isinstance(window, int) \
            and not isinstance(window, bool) and window > 0:
        shape = _replace(shape, sliding_window=window)
    if shape.sliding_window:
        layer_types = config.get("layer_types")
        if isinstance(layer_types, list):
            sliding = sum(t == "sliding_attention" for t in layer_types)
        elif isinstance(config.get("max_window_layers"), int):   # Qwen2: from that layer on
            sliding = max(0, shape.layers - config["max_window_layers"])
        else:   # Mistral 7B v0.1: every layer
            sliding = shape.layers
        shape = _replace(shape, sliding_layers=sliding) if sliding else _replace(
            shape, sliding_window=0)
    quant = config.get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, Mapping) else None
    if method == "mxfp4" and shape.experts:
        shape = _replace(shape, expert_weight_bits=MXFP4_BITS)
    elif method == "fp8":
        shape = _replace(shape, weight_bits=8)
    elif method in ("awq", "gptq") and isinstance(quant.get("bits"), int):
        # a 16-bit scale (and a zero point) per group of 128: about a quarter bit more
        shape = _replace(shape, weight_bits=quant["bits"] + 0.25)
    return shape


def _replace(shape: ModelShape, **changes: Any) -> ModelShape:
    from dataclasses import replace
    return replace(shape, **changes)


def _shape(name: str, fields: Mapping[str, Any], source: str) -> ModelShape:
    values: dict[str, Any] = {}
    for key, attr in {**CONFIG_KEYS, **MOE_KEYS}.items():
        if key not in fields or fields[key] is None:
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
    if ("experts" in values) != ("experts_per_token" in values):
        key = "num_experts_per_tok" if "experts" in values else "num_experts"
        raise ValueError(f"{key}: required with "
                         + ("num_experts" if "experts" in values else "num_experts_per_tok")
                         + " (a mixture of experts: how many, and how many a token uses)")
    if values.get("experts_per_token", 0) > values.get("experts", 0):
        raise ValueError(f"num_experts_per_tok: at most num_experts ({values['experts']}), "
                         f"not {values['experts_per_token']}")
    tied = fields.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise ValueError(f"tie_word_embeddings: true or false, not {tied!r}")
    key = "torch_dtype" if "torch_dtype" in fields else "dtype"
    dtype = fields.get(key) or "bfloat16"
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"{key}: one of {', '.join(DTYPE_BYTES)}, not {dtype!r}")
    return ModelShape(name, tied=tied, dtype_bytes=DTYPE_BYTES[dtype], source=source, **values)
