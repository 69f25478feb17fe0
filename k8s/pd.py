"""Disaggregated prefill and decode (HyperPod's `pdSpec`): whether it can pay here, decided at
synth time from the model, the instance type's network in the region, the KV handoff and the
worker image, as the L2's verdict is (k8s/l2.py).

P/D does not add throughput (vLLM's own docs: "Disaggregated prefill DOES NOT improve
throughput"); it keeps long prefills from stalling the decode of other requests, at the cost of
moving each request's KV from a prefill worker to a decode worker. It is rendered only where
all of these hold:
- the model: at least MIN_PARAMS parameters, or a mixture of experts (HyperPod's DPD guide:
  "dense 70B+"; llm-d's: 70B+ or large MoE). A small model prefills fast enough that
  colocated serving with chunked prefill does as well;
- the network: the instance type has EFA with GPUDirect RDMA in the region (config/instances.py
  EFA): over TCP the handoff costs about what the prefill it saves does (and NIXL's UCX over
  TCP is far slower than the link: Dynamo measured ~98 s against ~1 s TTFT at 8K);
- the handoff: moving the KV of a `kvCacheSpec.prefixTokens` prompt over the type's EFA, per
  GPU, takes at most HANDOFF_SHARE of computing it. The ratio is the L2 verdict's break-even
  (the GB/s a GPU produces KV at while prefilling, k8s/l2.py break_even_gbs) over the link's
  GB/s per GPU (the type's EFA bandwidth over its GPUs);
- the image: it carries NIXL and libfabric's EFA provider (config/images.py NIXL_EFA_IMAGES),
  and a vLLM whose KVTransferConfig has kv_load_failure_policy (0.13.0 on);
- the routing: not kvaware (vllm-router 0.1.17's P/D KV events need static sources);
- the node group: the environment's GPU node group for the type has `efa: true` (its launch
  template carries the type's EFA interfaces, constructs/gpu_cluster.py).
Otherwise the endpoint is rendered colocated with one warning naming the failing term, every
term's figure and what would change it. `pdSpec.forceDisaggregation: true` overrides the model
and handoff terms (cost), never the network, the image or the routing (what makes it work).
Load (HyperPod's ">= 2 req/s") and output length (">= 256 tokens") are not knowable at synth:
the warning and docs/serving.md say so.
"""
from __future__ import annotations

from dataclasses import dataclass

from config.bandwidth import pod_nic_gbps
from config.images import Image, NixlImage, nixl_efa_image
from config.instances import efa, gpu_direct_efa_in, gpu_model, gpu_shape
from config.models import ModelShape
from config.contracts import EFA_RESOURCE, NIXL_SIDE_CHANNEL_PORT, PD_ROLE_LABEL  # noqa: F401
from k8s.l2 import DEFAULT_PREFIX_TOKENS, MFU, break_even_gbs

MIN_PARAMS = 60e9          # "dense 70B+" (a 70B checkpoint has 70.6B; 60B leaves 72B-class in)
HANDOFF_SHARE = 0.10       # the handoff may take this share of the prefill it saves
KV_LOAD_FAILURE_POLICY_SINCE = (0, 13, 0)   # as k8s/workers.py
# How the front tells a long prompt from a short one without a tokenizer (k8s/router_front.py):
# a request's body bytes over this. English text runs ~4 characters per token; the body's JSON
# (keys, escaping, chat roles) and any non-ASCII text only add bytes, so the estimate of input
# tokens errs high: a request near the threshold goes through P/D rather than around it.
BODY_BYTES_PER_TOKEN = 4


@dataclass(frozen=True)
class Term:
    name: str            # what a warning calls it: "the model", "the network", ...
    holds: bool
    said: str            # the figure, in words
    change: str          # what would change it
    cost: bool           # a cost term (forceDisaggregation overrides it) or a correctness one


@dataclass(frozen=True)
class PDVerdict:
    instance_type: str
    region: str
    model: ModelShape | None
    prefix_tokens: int
    image: Image | None
    terms: tuple[Term, ...]
    handoff_share: float | None        # handoff / prefill over the link P/D would use
    tcp_share: float | None            # the same over the pod's TCP NIC, for the warning
    nixl: NixlImage | None = None

    def renders(self, forced: bool = False) -> bool:
        return all(t.holds or (forced and t.cost) for t in self.terms)

    def failing(self, forced: bool = False) -> Term | None:
        return next((t for t in self.terms if not (t.holds or (forced and t.cost))), None)

    def explain(self) -> str:
        """Every term in one line, the failing ones marked."""
        return "; ".join(f"{t.name}: {t.said}{'' if t.holds else ' (fails)'}"
                         for t in self.terms)


def _pct(x: float | None) -> str:
    return "unknown" if x is None else f"{x:.0%}" if x >= 0.1 else f"{x:.1%}"


def pd_verdict(*, instance_type: str, region: str, model: ModelShape | None, image: Image | None,
               vllm: tuple[int, int, int] | None = None,
               prefix_tokens: int = DEFAULT_PREFIX_TOKENS, strategy: str = "prefixaware",
               node_group: tuple[str, bool] | None = None) -> PDVerdict:
    """The verdict on disaggregating an endpoint (module docstring). `vllm`: the image's vLLM
    where config/images.py's release record knows it (a NIXL record knows it too);
    `node_group`: (name, efa) of the environment's group serving the type, where judged."""
    terms = []
    # the model
    if model is None:
        terms.append(Term("the model", False, "its shape is unknown", "name a model we know "
                          "or give kvCacheSpec.modelShape", True))
    else:
        moe = model.experts > 0
        big = model.params >= MIN_PARAMS or moe
        terms.append(Term("the model", big, f"{model.name}, {model.params / 1e9:.0f}B "
                          f"{'mixture of experts' if moe else 'dense'}",
                          f"a model of {MIN_PARAMS / 1e9:.0f}B parameters or more, or a "
                          "mixture of experts (HyperPod's guide: dense 70B+)", True))
    # the network
    e, shape, known = efa(instance_type), gpu_shape(instance_type), gpu_model(instance_type)
    gpus = shape.gpus if shape else 1
    direct = gpu_direct_efa_in(instance_type, region)
    if direct:
        net = f"{instance_type} has {e.interfaces} EFA ({e.gbps:g} Gbps, GPUDirect RDMA) in {region}"
    elif e is not None and e.gpu_direct:
        net = (f"{instance_type} has no GPUDirect RDMA EFA in {region} (in China only "
               "p4d.24xlarge in cn-northwest-1 has it)")
    elif e is not None:
        net = (f"{instance_type}'s EFA ({e.gbps:g} Gbps) has no GPUDirect RDMA: the KV would "
               "be staged through host memory")
    else:
        net = f"{instance_type} has no EFA"
    terms.append(Term("the network", direct, net, "an instance type with GPUDirect RDMA over "
                      "EFA in the region (p5, p5e, p5en, p6-b200, p4d, p4de; in China "
                      "p4d.24xlarge in cn-northwest-1) in the environment's instanceTypeMap",
                      False))
    # the handoff
    need = break_even_gbs(model, known[1], prefix_tokens) if model and known else None
    share = need / (e.gbps / 8 / gpus) if need is not None and direct else None
    tcp = need / (pod_nic_gbps(instance_type) / 8 / gpus) if need is not None and shape else None
    if share is not None:
        said = (f"moving a {prefix_tokens}-token prompt's KV over EFA "
                f"({e.gbps / 8 / gpus:.2f} GB/s per GPU) takes {_pct(share)} of prefilling it "
                f"({need:.2f} GB/s of KV per GPU at MFU {MFU:g})")
    elif tcp is not None:
        said = (f"no GPU-direct link to judge it on; over the pod's TCP NIC "
                f"({pod_nic_gbps(instance_type) / 8 / gpus:.2f} GB/s per GPU) a "
                f"{prefix_tokens}-token prompt's KV would move in {_pct(tcp)} of its prefill "
                "at line rate, which NIXL over TCP does not reach")
    else:
        said = "not judged (the model's shape or the GPU is unknown)"
    terms.append(Term("the handoff", share is not None and share <= HANDOFF_SHARE, said,
                      f"at most {HANDOFF_SHARE:.0%}: a longer kvCacheSpec.prefixTokens, a "
                      "larger model, or a faster link per GPU", True))
    # the image
    nixl = nixl_efa_image(image)
    version = nixl.vllm if nixl else vllm
    if image is None:
        img_ok, img = False, "no image"
    elif nixl is None:
        img_ok, img = False, (f"{image.source.split('/', 1)[1]}:{image.tag} is not known to "
                              "carry NIXL and libfabric's EFA provider")
    elif version < KV_LOAD_FAILURE_POLICY_SINCE:
        img_ok, img = False, (f"its vLLM {'.'.join(map(str, version))} has no "
                              "kv_load_failure_policy")
    else:
        img_ok, img = True, (f"{image.source.split('/', 1)[1]}:{image.tag} carries vLLM "
                             f"{'.'.join(map(str, nixl.vllm))}, NIXL "
                             f"{'.'.join(map(str, nixl.nixl))} and libfabric's EFA provider")
    terms.append(Term("the image", img_ok, img, "a worker.image carrying NIXL and libfabric's "
                      "EFA provider: " + ", ".join(f"{p}:{t}" for p, t in _nixl_images()),
                      False))
    if node_group is not None:
        name, has_efa = node_group
        terms.append(Term("the node group", has_efa, f"node group {name} "
                          f"{'carries' if has_efa else 'does not carry'} EFA (efa: "
                          f"{'true' if has_efa else 'false'})", f"efa: true on node group "
                          f"{name} in the environment file (a launch template with the type's "
                          "EFA interfaces, a cluster placement group, one zone)", False))
    terms.append(Term("the routing", strategy != "kvaware", f"routingStrategy {strategy}",
                      "prefixaware, session or roundrobin (vllm-router's P/D mode takes KV "
                      "events only from static sources)", False))
    return PDVerdict(instance_type, region, model, prefix_tokens, image, tuple(terms), share,
                     tcp, nixl)


def _nixl_images() -> list[tuple[str, str]]:
    from config.images import NIXL_EFA_IMAGES
    return sorted(NIXL_EFA_IMAGES)


def refusal(v: PDVerdict, where: str, forced: bool) -> str:
    """The one warning of an endpoint rendered colocated: the failing term, what would change
    it, and every term's figure."""
    t = v.failing(forced)
    assert t is not None
    force = ("; pdSpec.forceDisaggregation: true renders it anyway" if t.cost else
             "; pdSpec.forceDisaggregation cannot override it: P/D would not work")
    return (f"{where}.pdSpec: not disaggregated, every worker does both: {t.name} fails "
            f"({t.said}); it takes {t.change}{force}. All terms: {v.explain()}. Load (>= 2 "
            "req/s) and output length (>= 256 tokens), which HyperPod's guide also asks, are "
            "not known at synth (docs/serving.md, 'Disaggregated prefill and decode')")


# docs/serving.md's verdict table: (instance, region, model, prefix tokens)
VERDICT_ROWS = (
    ("p5.48xlarge", "us-west-2", "Llama-3.1-70B", 8192),
    ("p5.48xlarge", "us-west-2", "Llama-3.1-70B", 1024),
    ("p5.48xlarge", "us-west-2", "Llama-3.1-8B", 8192),
    ("p5en.48xlarge", "us-east-1", "Llama-3.1-70B", 8192),
    ("p5.48xlarge", "us-west-2", "Qwen3-30B-A3B", 8192),
    ("p4d.24xlarge", "cn-northwest-1", "Llama-3.1-70B", 8192),
    ("p4d.24xlarge", "cn-north-1", "Llama-3.1-70B", 8192),
    ("g5.48xlarge", "cn-northwest-1", "Llama-3.1-70B", 8192),
    ("g5.24xlarge", "cn-northwest-1", "Llama-3.1-8B", 8192),
)
VERDICT_IMAGE = "public.ecr.aws/deep-learning-containers/vllm:server-hyperpod-cuda-v1.1"


def verdict_table() -> str:
    """docs/serving.md's table (tests/k8s/test_pd.py holds the two equal)."""
    from config.images import image_for
    from config.models import known_model

    lines = ["| instance | region | model | prefix | handoff / prefill, EFA | over TCP | "
             "P/D | failing term |", "|---|---|---|---|---|---|---|---|"]
    for instance, region, name, prefix in VERDICT_ROWS:
        v = pd_verdict(instance_type=instance, region=region, model=known_model(name),
                       image=image_for(VERDICT_IMAGE), prefix_tokens=prefix)
        failing = v.failing()
        forced = v.renders(forced=True)
        lines.append(f"| {instance} | {region} | {name} | {prefix // 1024}K | "
                     f"{'-' if v.handoff_share is None else _pct(v.handoff_share)} | "
                     f"{_pct(v.tcp_share)} | "
                     f"{'yes' if v.renders() else 'forced only' if forced else 'no'} | "
                     f"{failing.name if failing else '-'} |")
    return "\n".join(lines)
