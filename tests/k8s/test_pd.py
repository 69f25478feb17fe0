"""Disaggregated prefill/decode (issue 33): pdSpec read as HyperPod defines it, the verdict
(k8s/pd.py) and what it renders, on the HyperPod docs' DPD example (bench/pd_render.py): global on
p5.48xlarge and China on p4d.24xlarge rendered, China on g5 refused in one line."""
from __future__ import annotations

import json
import re

import kubernetes_validate
import pytest

from config import ConfigError
from config.endpoint_spec import merge_args, parse_endpoint
from config.instances import EFA, GPU_SHAPES, gpu_direct_efa_in
from k8s.pd import EFA_RESOURCE, NIXL_SIDE_CHANNEL_PORT, PD_ROLE_LABEL, verdict_table
from tests.conftest import ROOT
from tests.k8s.crds import is_custom_resource, validate_custom_resources
from tests.k8s.netpol import Endpoint, allowed
from bench.pd_render import dpd_raw, render, rendered

RENDERS = [("dev", "p5.48xlarge"), ("china", "p4d.24xlarge")]


def _pods(r):
    return {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in r.docs
            if d["kind"] == "Deployment"}


def test_the_crds_pdspec_fields_all_parse_with_hyperpods_defaults():
    def edit(raw):
        pd = raw["spec"]["pdSpec"]
        del pd["routingThreshold"], pd["decodingSpec"]["replicas"]
        pd["prefillSpec"].update(replicas=3, args=["--tensor-parallel-size=4", "--enforce-eager"],
                                 nodeSelector={"example.com/pool": "prefill"})
        pd["prefillSpec"]["resources"] = {"requests": {"nvidia.com/gpu": "4"},
                                          "limits": {"nvidia.com/gpu": "4"}}
        pd["topologySpec"] = {"sameAZ": False, "availabilityZone": "us-west-2b"}
        pd["autoScalingSpec"] = {"decodingAutoScaling": {"minReplicaCount": 1,
                                                         "maxReplicaCount": 3}}
    s = parse_endpoint("dev", "f.yaml", dpd_raw(edit))
    pd = s.pd
    assert pd.routing_threshold == 4096 and pd.decode.replicas == 1      # the CRD's defaults
    assert pd.prefill.replicas == 3 and pd.prefill.gpus == 4 and pd.decode.gpus == 8
    args = pd.prefill.args
    # appended after the shared args, the role's flag winning (the shared one and its value go)
    assert args[-2:] == ("--tensor-parallel-size=4", "--enforce-eager")
    assert "--tensor-parallel-size" not in args and args.count("8") == 0
    assert pd.prefill.node_selector == (("example.com/pool", "prefill"),)
    assert (pd.same_az, pd.availability_zone) == (False, "us-west-2b")
    assert pd.decode.autoscaling.max_replicas == 3 and pd.prefill.autoscaling is None
    assert parse_endpoint("dev", "f.yaml", dpd_raw(
        lambda r: r["spec"]["pdSpec"].update(routingThreshold=0))).pd.routing_threshold == 0


@pytest.mark.parametrize("shared,role,merged", [
    (["/m", "--a", "1", "--b"], ["--a", "2"], ("/m", "--b", "--a", "2")),
    (["--max_num_seqs=8", "--c", "x"], ["--max-num-seqs", "4"], ("--c", "x", "--max-num-seqs", "4")),
    (["--x", "-1"], ["--y"], ("--x", "-1", "--y")),
])
def test_a_roles_flags_replace_the_shared_ones(shared, role, merged):
    assert merge_args(shared, role) == merged


@pytest.mark.parametrize("edit,field", [
    (lambda pd: pd.update(routingThreshold=-1), "spec.pdSpec.routingThreshold"),
    (lambda pd: pd["prefillSpec"].update(replicas=0), "spec.pdSpec.prefillSpec.replicas"),
    (lambda pd: pd.pop("decodingSpec"), "spec.pdSpec.decodingSpec"),
    (lambda pd: pd["decodingSpec"].update(resources={"limits": {"nvidia.com/gpu": "3"}}),
     "spec.pdSpec.decodingSpec.resources.limits.nvidia.com/gpu"),
    (lambda pd: pd["prefillSpec"].update(args=["--api-key", "x"]), "spec.pdSpec.prefillSpec.args"),
    (lambda pd: pd.update(topologySpec={"sameAz": True}), "spec.pdSpec.topologySpec.sameAz"),
])
def test_a_bad_pdspec_is_one_line_naming_the_field(edit, field):
    with pytest.raises(ConfigError) as err:
        parse_endpoint("dev", "f.yaml", dpd_raw(lambda r: edit(r["spec"]["pdSpec"])))
    assert field in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("env,itype", RENDERS)
def test_the_dpd_example_renders_disaggregated(env, itype):
    r = rendered(env, itype)
    (said,) = r.pd_warnings()
    assert "disaggregated" in said and "not disaggregated" not in said
    pods = _pods(r)
    assert set(pods) == {"dpd-test-prefill", "dpd-test-decode", "dpd-test-router"}
    for role in ("prefill", "decode"):
        pod = pods[f"dpd-test-{role}"]
        (vllm,) = pod["containers"]
        args = vllm["args"]
        config = json.loads(args[args.index("--kv-transfer-config") + 1])
        nixl = (config["kv_connector_extra_config"]["connectors"][0]
                if config["kv_connector"] == "MultiConnector" else config)
        assert nixl["kv_connector"] == "NixlConnector" and nixl["kv_role"] == "kv_both"
        assert nixl["kv_connector_extra_config"]["backends"] == ["LIBFABRIC"]
        assert config["kv_load_failure_policy"] == "fail"
        # L1 kept on prefill (LMCache beside NIXL), decode NIXL only
        assert (config["kv_connector"] == "MultiConnector") is (role == "prefill")
        env_vars = {e["name"]: e for e in vllm["env"]}
        assert env_vars["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"]["fieldRef"][
            "fieldPath"] == "status.podIP"
        assert env_vars["VLLM_NIXL_SIDE_CHANNEL_PORT"]["value"] == str(NIXL_SIDE_CHANNEL_PORT)
        efa = str(EFA[r.spec.instance_type].interfaces)     # the whole node: 8 of 8 GPUs
        assert vllm["resources"]["requests"][EFA_RESOURCE] == efa
        assert vllm["resources"]["limits"][EFA_RESOURCE] == efa
        assert pod["nodeSelector"]["kvcache.io/node-group"] == "efa"
    router = {c["name"]: c for c in pods["dpd-test-router"]["containers"]}
    pd_args = router["router"]["args"]
    assert pd_args[:3] == ["--vllm-pd-disaggregation", "--kv-connector", "nixl"]
    assert f"{PD_ROLE_LABEL}=prefill" in pd_args and f"{PD_ROLE_LABEL}=decode" in pd_args
    assert "OPENAI_API_KEY" in router["router"]["command"][2]   # what the P/D router sends
    decode_only = router["router-decode"]["args"]
    assert decode_only[decode_only.index("--selector") + 3] == f"{PD_ROLE_LABEL}=decode"


@pytest.mark.parametrize("env,itype", RENDERS)
def test_every_rendered_object_passes_strict_schemas_and_the_keda_crd(env, itype):
    r = rendered(env, itype)
    for doc in r.docs:
        if not is_custom_resource(doc):
            kubernetes_validate.validate(doc, r.cfg.kubernetes_version + ".0", strict=True)
    validate_custom_resources([d for d in r.docs if is_custom_resource(d)])


@pytest.mark.parametrize("env,itype", RENDERS)
def test_ipc_lock_is_the_only_capability_added_and_only_on_pd_workers(env, itype):
    r = rendered(env, itype)
    (ns,) = [d for d in r.docs if d["kind"] == "Namespace"]
    labels = ns["metadata"]["labels"]
    # IPC_LOCK is admitted by `privileged` only; audit and warn keep restricted's eye on it
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels["pod-security.kubernetes.io/audit"] == "restricted"
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"
    for name, pod in _pods(r).items():
        for c in pod.get("initContainers", []) + pod["containers"]:
            sc = c["securityContext"]
            pd_worker = c["name"] == "vllm" and name.endswith(("-prefill", "-decode"))
            want = {"drop": ["ALL"], "add": ["IPC_LOCK"]} if pd_worker else {"drop": ["ALL"]}
            assert sc["capabilities"] == want, (name, c["name"])
            # root only where the capability must reach the process (tests/k8s/
            # test_pd_memlock.py); every other container keeps its non-root UID
            assert (sc.get("runAsUser", pod["securityContext"].get("runAsUser")) == 0) == \
                pd_worker, (name, c["name"])
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"]


def test_without_pd_the_namespace_stays_restricted():
    r = rendered("china", "g5.48xlarge")
    (ns,) = [d for d in r.docs if d["kind"] == "Namespace"]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


@pytest.mark.parametrize("env,itype", RENDERS)
def test_network_policies_admit_exactly_the_new_paths(env, itype):
    r = rendered(env, itype)
    policies = [d for d in r.docs if d["kind"] == "NetworkPolicy"]
    ns = r.spec and "kvcache-serving"
    base = {"app.kubernetes.io/name": "vllm-worker", "app.kubernetes.io/instance": "dpd-test"}
    pod = {role: Endpoint(role, f"10.0.0.{i}", ns, {**base, PD_ROLE_LABEL: role})
           for i, role in enumerate(("prefill", "decode"), 1)}
    router = Endpoint("router", "10.0.0.9", ns, {"app.kubernetes.io/name": "vllm-router",
                                                 "app.kubernetes.io/instance": "dpd-test"})
    other = Endpoint("other", "10.0.0.8", ns, {"app.kubernetes.io/name": "x"})
    port = NIXL_SIDE_CHANNEL_PORT
    assert allowed(policies, pod["decode"], pod["prefill"], port)       # the side channel
    assert not allowed(policies, other, pod["prefill"], port)
    assert not allowed(policies, router, pod["prefill"], port)
    for role in ("prefill", "decode"):
        assert allowed(policies, router, pod[role], 8000)                 # requests
        assert not allowed(policies, other, pod[role], 8000)


def test_china_g5_is_refused_in_one_line_naming_the_network():
    r = rendered("china", "g5.48xlarge")
    (said,) = r.pd_warnings()
    assert "\n" not in said and "not disaggregated" in said
    assert re.search(r"the network fails \(g5\.48xlarge", said)
    assert "p4d.24xlarge in cn-northwest-1" in said      # what would change it
    assert {d["metadata"]["name"] for d in r.docs if d["kind"] == "Deployment"} == {
        "dpd-test-workers", "dpd-test-router"}


def test_a_force_overrides_cost_never_correctness():
    small = lambda raw: raw["spec"].update(modelName="Llama-3.1-8B-Instruct")  # noqa: E731
    refused = render("dev", "p5.48xlarge", dpd_raw(small))
    assert refused.spec.pd is None and "the model fails" in refused.pd_warnings()[0]
    forced = render("dev", "p5.48xlarge", dpd_raw(lambda raw: (
        small(raw), raw["spec"]["pdSpec"].update(forceDisaggregation=True))))
    assert forced.spec.pd is not None and "forced" in forced.pd_warnings()[0]
    # the network is correctness: forcing China's g5 changes nothing
    g5 = render("china", "g5.48xlarge", dpd_raw(
        lambda raw: raw["spec"]["pdSpec"].update(forceDisaggregation=True)))
    assert g5.spec.pd is None and "cannot override" in g5.pd_warnings()[0]


def test_an_image_without_nixl_and_libfabric_is_refused_by_name():
    r = render("dev", "p5.48xlarge", dpd_raw(lambda raw: raw["spec"]["worker"].update(
        image="docker.io/vllm/vllm-openai:v0.19.0")))
    (said,) = r.pd_warnings()
    assert "the image fails" in said and "server-hyperpod-cuda-v1.1" in said


def test_gpu_direct_efa_in_china_is_p4d_in_cn_northwest_1_only():
    direct = {(t, r) for t in GPU_SHAPES for r in ("cn-north-1", "cn-northwest-1")
              if gpu_direct_efa_in(t, r)}
    assert direct == {("p4d.24xlarge", "cn-northwest-1")}
    for t, e in EFA.items():    # every EFA type is one we size, with interfaces to give
        assert t in GPU_SHAPES and e.interfaces >= 1 and e.gbps > 0


def test_docs_show_the_verdicts_as_synth_makes_them():
    doc = (ROOT / "docs" / "serving.md").read_text()
    block = re.search(r"<!-- pd-verdicts:begin[^>]*-->\n(.*?)\n<!-- pd-verdicts:end -->", doc,
                      re.S)
    assert block and block.group(1) == verdict_table()


def test_each_role_scales_on_its_own_keda_object():
    def edit(raw):
        raw["spec"]["pdSpec"]["autoScalingSpec"] = {
            "prefillAutoScaling": {"minReplicaCount": 1, "maxReplicaCount": 2},
            "decodingAutoScaling": {"minReplicaCount": 1, "maxReplicaCount": 3,
                                    "prometheusTrigger": {
                                        "query": "sum(vllm:num_requests_running)",
                                        "targetValue": 32}}}
    r = render("dev", "p5.48xlarge", dpd_raw(edit))
    scaled = {d["spec"]["scaleTargetRef"]["name"]: d for d in r.docs
              if d["kind"] == "ScaledObject"}
    assert {"dpd-test-prefill", "dpd-test-decode"} <= set(scaled)
    prefill, decode = scaled["dpd-test-prefill"]["spec"], scaled["dpd-test-decode"]["spec"]
    assert (prefill["maxReplicaCount"], decode["maxReplicaCount"]) == (2, 3)
    # the default trigger counts the role's own pods; a file's trigger is kept as written
    assert 'pod=~"dpd-test-prefill-.+"' in prefill["triggers"][0]["metadata"]["query"]
    assert decode["triggers"][0]["metadata"]["query"] == "sum(vllm:num_requests_running)"
    validate_custom_resources([d for d in r.docs if is_custom_resource(d)])
    # decode scales to 3: the P/D router balances decode by load
    args = r.container("dpd-test-router", "router")["args"]
    assert args[args.index("--decode-policy") + 1] == "power_of_two"
