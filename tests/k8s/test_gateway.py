"""The inference gateway path (k8s/gateway.py, issue 34): every rendered InferencePool against the
pinned InferencePool v1 CRD, every HTTPRoute against Gateway API v1.4.1's, both strictly (no
field the CRD lacks) and with the CRDs' CEL rules' intent; the pool selects exactly the
endpoint's worker pods on the port the router reaches them on; the EPP's config, args and
plugins are the pinned release's (tests/fixtures/gateway/epp-v1.5.0.json, read from its
source); strict Kubernetes schemas, restricted pod security, China's ECR; one-line refusals."""
from __future__ import annotations

import copy
import dataclasses
import json
from functools import lru_cache

import cdk8s
import jsonschema
import kubernetes_validate
import pytest
import yaml

from config import ConfigError
from config.contracts import SERVING_NAMESPACE, WORKER_LIMITS_GATEWAY_PORT, WORKER_LIMITS_PORT
from config.endpoint_spec import parse_endpoint
from config.environment import GATEWAY_IMPLEMENTATIONS
from k8s.gateway import (
    COMPONENT, CRD_FILE, DEFAULT_PROFILE, MODEL_HEADER, POOL_API, crd, epp_config, gateway_check,
    routes_check,
)
from k8s.serving import build_charts, fit_endpoint, worker_service_account
from tests.conftest import ROOT, context_for
from tests.k8s.crds import gateway_schemas, is_custom_resource, validate_custom_resources
from tests.k8s.netpol import selector_matches
from tests.k8s.test_charts import SEED, _env, _facts

DATA = ROOT / "tests" / "fixtures" / "gateway"
EPP = json.loads((DATA / "epp-v1.5.0.json").read_text())
# the dev sample's system nodes (m6i.xlarge) hold 2 of upstream's 4 picker CPUs
GATEWAY = {"gateway": {"name": "inference", "namespace": "istio-ingress"},
           "implementation": "istio", "picker": {"cpu": 2}}
LIMITS = {"maxConcurrentRequests": 4, "maxQueueSize": 8}
# (environment, strategy, request limits): each partition, each strategy the EPP serves, with
# and without the per-worker limit sidecar (the whole app: tests/stacks/test_gateway_synth.py)
CASES = [("dev", "prefixaware", True), ("china", "kvaware", False)]


def _raw(strategy="prefixaware", limits=False, enabled=True) -> dict:
    raw = copy.deepcopy(SEED)
    raw["spec"]["intelligentRoutingSpec"]["routingStrategy"] = strategy
    raw["spec"]["inferenceGateway"] = {"enabled": enabled}
    if limits:
        raw["spec"]["worker"]["requestLimits"] = dict(LIMITS)
    return raw


@lru_cache(maxsize=None)
def rendered(env: str, strategy: str, limits: bool) -> tuple:
    cfg = _env(env, inferenceGateway=GATEWAY)
    spec = fit_endpoint(cfg, parse_endpoint(cfg.name, "endpoints/test.yaml",
                                            _raw(strategy, limits)))
    gateway_check(cfg, spec)
    docs = [d for c in build_charts(cdk8s.App(), cfg, (spec,), _facts(cfg, spec))
            for d in c.to_json()]
    return cfg, spec, docs


def _one(docs, kind):
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


POOL_SCHEMA, ROUTE_SCHEMA = (gateway_schemas()[POOL_API],
                             gateway_schemas()["gateway.networking.k8s.io/v1"])


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_pools_and_routes_validate_against_the_pinned_crds(case):
    _, spec, docs = rendered(*case)
    pool, route = _one(docs, "InferencePool"), _one(docs, "HTTPRoute")
    assert pool["apiVersion"] == POOL_API and route["apiVersion"] == "gateway.networking.k8s.io/v1"
    jsonschema.validate(pool, POOL_SCHEMA)
    jsonschema.validate(route, ROUTE_SCHEMA)
    # the CRDs' CEL rules: unique target ports; a Service picker names its port
    ports = [p["number"] for p in pool["spec"]["targetPorts"]]
    assert len(set(ports)) == len(ports)
    ref = pool["spec"]["endpointPickerRef"]
    assert ref.get("kind", "Service") != "Service" or "port" in ref
    # the route: the environment's Gateway in, the pool out, in the pool's namespace
    (parent,) = route["spec"]["parentRefs"]
    assert (parent["kind"], parent["name"], parent["namespace"]) == (
        "Gateway", GATEWAY["gateway"]["name"], GATEWAY["gateway"]["namespace"])
    (rule,) = route["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    assert (backend["group"], backend["kind"], backend["name"]) == (
        "inference.networking.k8s.io", "InferencePool", pool["metadata"]["name"])
    assert route["metadata"]["namespace"] == pool["metadata"]["namespace"]


def test_the_strict_schemas_see_a_stray_field():
    _, _, docs = rendered(*CASES[0])
    pool = copy.deepcopy(_one(docs, "InferencePool"))
    pool["spec"]["extensionRef"] = {"name": "x"}         # the pre-v1 field name
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(pool, POOL_SCHEMA)
    route = copy.deepcopy(_one(docs, "HTTPRoute"))
    route["spec"]["rules"][0]["backendRefs"][0]["weight"] = -1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(route, ROUTE_SCHEMA)


def _pods(docs):
    return {d["metadata"]["name"]: d["spec"]["template"] for d in docs
            if d["kind"] in ("Deployment", "StatefulSet")}


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_the_pool_selects_exactly_the_workers_on_the_port_the_router_uses(case):
    _, spec, docs = rendered(*case)
    pool = _one(docs, "InferencePool")
    selected = {name for name, t in _pods(docs).items()
                if selector_matches(pool["spec"]["selector"], t["metadata"]["labels"])}
    assert selected == {f"{spec.name}-workers"}
    (port,) = [p["number"] for p in pool["spec"]["targetPorts"]]
    # with request limits vLLM listens on loopback: the sidecar is the only way in, and the
    # per-worker limit holds on both paths; the gateway has a port of the sidecar's own, where
    # a full worker is answered with the file's status (the routers' port answers what the
    # router pod's front translates)
    assert port == (WORKER_LIMITS_GATEWAY_PORT if spec.request_limits else spec.port)
    worker = _pods(docs)[f"{spec.name}-workers"]["spec"]
    sidecar = [c for c in worker.get("initContainers", []) if c["name"] == "request-limits"]
    listening = {p["containerPort"] for c in (sidecar or worker["containers"])
                 for p in c.get("ports", [])}
    assert port in listening
    router = [c for c in _pods(docs)[f"{spec.name}-router"]["spec"]["containers"]
              if c["name"] == "router"][0]
    router_port = WORKER_LIMITS_PORT if spec.request_limits else spec.port
    assert str(router_port) in json.dumps(router) and router_port in listening


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_the_epp_config_is_the_pinned_releases(case):
    _, _, docs = rendered(*case)
    strategy = case[1]
    config = yaml.safe_load(next(d for d in docs if d["kind"] == "ConfigMap"
                                 and d["metadata"]["name"].endswith("-epp"))["data"]["epp.yaml"])
    assert config == epp_config(strategy)
    assert (config["apiVersion"], config["kind"]) == (EPP["apiVersion"], EPP["kind"])
    assert set(config) <= set(EPP["config_fields"])
    names = set()
    for plugin in config["plugins"]:
        assert set(plugin) <= set(EPP["plugin_fields"])
        assert plugin["type"] in EPP["plugins"], plugin
        assert set(plugin.get("parameters", {})) <= set(EPP["plugins"][plugin["type"]])
        names.add(plugin.get("name", plugin["type"]))
    (profile,) = config["schedulingProfiles"]
    assert set(profile) <= set(EPP["profile_fields"])
    refs = {p["pluginRef"]: p.get("weight") for p in profile["plugins"]}
    assert all(set(p) <= set(EPP["profile_plugin_fields"]) for p in profile["plugins"])
    assert set(refs) <= names
    # the release's default scheduling: its scorers and weights, and its max-score picker
    assert {k: v for k, v in refs.items() if v is not None} == EPP["default_profile"]
    assert dict(DEFAULT_PROFILE) == EPP["default_profile"]
    assert "max-score-picker" in refs


def test_the_epp_runs_its_releases_flags_restricted_on_the_system_nodes():
    cfg, spec, docs = rendered(*CASES[0])
    epp = next(d for d in docs if d["kind"] == "Deployment"
               and d["metadata"]["name"] == f"{spec.name}-epp")
    pod = epp["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    flags = [a.split("=", 1)[0].lstrip("-") for a in c["args"] if a.startswith("-")]
    assert flags and set(flags) <= set(EPP["flags"]), set(flags) - set(EPP["flags"])
    args = c["args"]
    assert args[args.index("--pool-name") + 1] == _one(docs, "InferencePool")["metadata"]["name"]
    assert c["image"].endswith("gateway-api-inference-extension/epp:v1.5.0")
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] and not sc["allowPrivilegeEscalation"]
    assert sc["capabilities"]["drop"] == ["ALL"] and sc["readOnlyRootFilesystem"]
    assert pod["nodeSelector"] and pod["serviceAccountName"] == f"{spec.name}-epp"
    ns = _one(docs, "Namespace")["metadata"]["labels"]
    assert ns["pod-security.kubernetes.io/enforce"] == "restricted"
    # the picker's own Service exposes ext-proc only (health and metrics stay in the pod)
    svc = next(d for d in docs if d["kind"] == "Service"
               and d["metadata"]["name"] == f"{spec.name}-epp")
    assert [p["port"] for p in svc["spec"]["ports"]] == [9002]
    role = next(d for d in docs if d["kind"] == "Role"
                and d["metadata"]["name"] == f"{spec.name}-epp")
    assert all(set(r["verbs"]) == {"get", "list", "watch"} for r in role["rules"])


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_every_object_passes_strict_schemas_and_the_crd_comes_first(case):
    cfg, _, docs = rendered(*case)
    ours = [d for d in docs if d["kind"] == "CustomResourceDefinition" or d["metadata"].get(
        "labels", {}).get("app.kubernetes.io/name") == COMPONENT]   # the rest: test_charts.py
    assert {d["kind"] for d in ours} >= {"Deployment", "Service", "ConfigMap", "Role"}
    for doc in ours:
        if not is_custom_resource(doc):
            kubernetes_validate.validate(doc, cfg.kubernetes_version + ".0", strict=True)
    kinds = [d["kind"] for d in docs]
    assert kinds.index("CustomResourceDefinition") < kinds.index("InferencePool")
    assert kinds.count("CustomResourceDefinition") == 1
    if cfg.facts.china:      # pulled from the account's ECR only
        registry = f"{cfg.account}.{cfg.facts.ecr_host_suffix}/"
        images = {c["image"] for t in _pods(docs).values()
                  for c in t["spec"]["containers"] + t["spec"].get("initContainers", [])}
        assert images and all(i.startswith(registry) for i in images), images


def test_a_cluster_with_the_crd_already_keeps_its_own():
    cfg = _env("dev", inferenceGateway={**GATEWAY, "installCrd": False})
    spec = fit_endpoint(cfg, parse_endpoint(cfg.name, "e.yaml", _raw()))
    kinds = [d["kind"] for c in build_charts(cdk8s.App(), cfg, (spec,), _facts(cfg, spec))
             for d in c.to_json()]
    assert "InferencePool" in kinds and "CustomResourceDefinition" not in kinds


def test_the_installed_crd_is_the_pinned_release():
    doc = crd()
    assert doc["metadata"]["annotations"]["inference.networking.k8s.io/bundle-version"] == "v1.5.0"
    assert "status" not in doc and "v1.5.0" in (DATA / "README.md").read_text()
    assert CRD_FILE.name in (DATA / "README.md").read_text()


def test_endpoints_that_do_not_ask_render_no_gateway_objects():
    cfg = _env("dev", inferenceGateway=GATEWAY)
    spec = fit_endpoint(cfg, parse_endpoint(cfg.name, "e.yaml", _raw(enabled=False)))
    docs = [d for c in build_charts(cdk8s.App(), cfg, (spec,), _facts(cfg, spec))
            for d in c.to_json()]
    assert not {"InferencePool", "HTTPRoute", "CustomResourceDefinition"} & {
        d["kind"] for d in docs}
    every = _env("dev", inferenceGateway={**GATEWAY, "allEndpoints": True})
    docs = [d for c in build_charts(cdk8s.App(), every, (spec,), _facts(every, spec))
            for d in c.to_json()]
    assert {"InferencePool", "HTTPRoute"} <= {d["kind"] for d in docs}


@pytest.mark.parametrize("strategy,said", [("roundrobin", "no round-robin scorer"),
                                           ("session", "no session-affinity scorer")])
def test_a_strategy_the_epp_cannot_serve_is_refused_in_one_line(strategy, said):
    cfg = _env("dev", inferenceGateway=GATEWAY)
    spec = parse_endpoint(cfg.name, "e.yaml", _raw(strategy))
    with pytest.raises(ConfigError) as err:
        gateway_check(cfg, spec)
    assert said in str(err.value) and "spec.inferenceGateway.enabled" in str(err.value)
    assert "\n" not in str(err.value)


def test_asking_without_a_gateway_named_is_refused_in_one_line():
    cfg = _env("dev")
    with pytest.raises(ConfigError) as err:
        gateway_check(cfg, parse_endpoint(cfg.name, "e.yaml", _raw()))
    assert "inferenceGateway: {gateway: {name, namespace}}" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("over,field", [
    ({"gateway": {"name": "Bad_Name", "namespace": "x"}}, "inferenceGateway.gateway.name"),
    ({"gateway": {"name": "g"}}, "inferenceGateway.gateway.namespace"),
    ({**GATEWAY, "failureMode": "Open"}, "inferenceGateway.failureMode"),
    ({**GATEWAY, "proxyPods": {"labels": {}}}, "inferenceGateway.proxyPods.labels"),
    ({**GATEWAY, "proxyPods": {"labels": {"app": "a b"}}}, "inferenceGateway.proxyPods.labels.app"),
    ({**GATEWAY, "gatewayRef": {}}, "inferenceGateway.gatewayRef"),
    ({**GATEWAY, "installCrd": "no"}, "inferenceGateway.installCrd"),
    ({"gateway": GATEWAY["gateway"]}, "inferenceGateway.implementation"),
    ({**GATEWAY, "implementation": "envoy"}, "inferenceGateway.implementation"),
    ({**GATEWAY, "picker": {}}, "inferenceGateway.picker.cpu"),   # upstream's 4 > 2
    ({**GATEWAY, "picker": {"cpu": 2, "memoryGiB": 12}}, "inferenceGateway.picker.memoryGiB"),
])
def test_a_bad_environment_field_is_one_line_naming_it(over, field):
    with pytest.raises(ConfigError) as err:
        _env("dev", inferenceGateway=over)
    assert f"{field} =" in str(err.value) and "\n" not in str(err.value)


def test_the_hyperpod_field_is_read_and_a_typo_refused():
    assert parse_endpoint("dev", "e.yaml", _raw()).inference_gateway is True
    raw = _raw()
    raw["spec"]["inferenceGateway"] = {"enable": True}
    with pytest.raises(ConfigError) as err:
        parse_endpoint("dev", "e.yaml", raw)
    assert "spec.inferenceGateway.enable" in str(err.value)


def test_the_epp_is_in_the_namespace_of_its_pool():
    _, _, docs = rendered(*CASES[1])
    for kind in ("InferencePool", "HTTPRoute"):
        assert _one(docs, kind)["metadata"]["namespace"] == SERVING_NAMESPACE


@pytest.mark.parametrize("implementation", GATEWAY_IMPLEMENTATIONS)
def test_istio_reaches_the_pickers_tls_and_no_other_gateway_gets_an_istio_object(implementation):
    """The picker serves TLS (v1.5.0 SecureServing defaults on; we pass no --secure-serving):
    Istio's Envoy speaks TLS to it only through a DestinationRule, as upstream's chart renders
    for provider istio. Checked against Istio 1.29's CRD schema."""
    cfg = _env("dev", inferenceGateway={**GATEWAY, "implementation": implementation})
    spec = fit_endpoint(cfg, parse_endpoint(cfg.name, "endpoints/test.yaml", _raw()))
    docs = [d for c in build_charts(cdk8s.App(), cfg, (spec,), _facts(cfg, spec))
            for d in c.to_json()]
    rules = [d for d in docs if d["kind"] == "DestinationRule"]
    if implementation != "istio":
        assert not rules and not any("istio.io" in d["apiVersion"] for d in docs)
        return
    (rule,) = rules
    svc = next(d for d in docs if d["kind"] == "Service"
               and d["metadata"]["name"] == f"{spec.name}-epp")
    assert rule["spec"]["host"] == (f"{svc['metadata']['name']}."
                                    f"{svc['metadata']['namespace']}.svc.cluster.local")
    assert rule["metadata"]["namespace"] == svc["metadata"]["namespace"]
    assert rule["spec"]["trafficPolicy"]["tls"] == {"mode": "SIMPLE", "insecureSkipVerify": True}
    validate_custom_resources([rule])
    epp = next(d for d in docs if d["kind"] == "Deployment"
               and d["metadata"]["name"] == f"{spec.name}-epp")
    assert "--secure-serving=false" not in epp["spec"]["template"]["spec"]["containers"][0]["args"]


def test_the_picker_is_sized_as_upstreams_chart_where_the_system_nodes_hold_it():
    cfg = _env("dev", inferenceGateway={k: v for k, v in GATEWAY.items() if k != "picker"},
               nodeGroups={**context_for(env="dev")["environments"]["dev"]["nodeGroups"],
                           "system": {"instanceTypes": ["m6i.2xlarge"], "minSize": 2,
                                      "maxSize": 3}})
    spec = fit_endpoint(cfg, parse_endpoint(cfg.name, "endpoints/test.yaml", _raw()))
    docs = [d for c in build_charts(cdk8s.App(), cfg, (spec,), _facts(cfg, spec))
            for d in c.to_json()]
    epp = next(d for d in docs if d["kind"] == "Deployment"
               and d["metadata"]["name"] == f"{spec.name}-epp")
    assert epp["spec"]["template"]["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "4", "memory": "8Gi"}, "limits": {"memory": "16Gi"}}


def _two(route: dict, same_model: bool = False) -> tuple:
    """Two endpoints of different models joining the one Gateway, rendered."""
    cfg = _env("dev", inferenceGateway={**GATEWAY, **route})
    raws = []
    for name, model in (("chat-a", "Llama-3.3-70B-Instruct"), ("chat-b", "gpt-oss-120b")):
        raw = _raw()
        raw["metadata"]["name"] = name
        raw["spec"]["modelName"] = "Llama-3.3-70B-Instruct" if same_model else model
        raws.append(raw)
    specs = tuple(fit_endpoint(cfg, parse_endpoint(cfg.name, f"endpoints/{r['metadata']['name']}"
                                                   ".yaml", r)) for r in raws)
    routes_check(cfg, specs)
    facts = dataclasses.replace(_facts(cfg, specs[0]), service_account={
        s.name: worker_service_account(s.name) for s in specs})
    docs = [d for c in build_charts(cdk8s.App(), cfg, specs, facts) for d in c.to_json()]
    return cfg, specs, docs


def _gateway_picks(routes: list[dict], host: str, headers: dict[str, str]) -> set[str]:
    """The pools a Gateway sends a request to, by Gateway API's HTTPRoute rules (a stand-in
    for the gateway's own matching): a route whose hostnames admit the host (or none listed),
    a match whose path prefix and every header (Exact) hold; among those that match, the
    most specific (exact hostname over none, longer path, more headers); a tie between
    routes goes to one of them (the oldest, then by name), which we report as both."""
    found = []
    for route in routes:
        names = route["spec"].get("hostnames")
        if names and host not in names:
            continue
        for rule in route["spec"]["rules"]:
            for m in rule["matches"]:
                if not "/v1/chat/completions".startswith(m["path"]["value"]):
                    continue
                if any(headers.get(h["name"]) != h["value"] for h in m.get("headers", [])):
                    continue
                rank = (bool(names), len(m["path"]["value"]), len(m.get("headers", [])))
                found += [(rank, b["name"]) for b in rule["backendRefs"]]
    if not found:
        return set()
    best = max(rank for rank, _ in found)
    return {pool for rank, pool in found if rank == best}


@pytest.mark.parametrize("route", [{"routeBy": "model"},
                                   {"routeBy": "hostname", "domain": "models.example.com"}])
def test_two_endpoints_behind_one_gateway_are_each_reachable(route):
    cfg, specs, docs = _two(route)
    routes = [d for d in docs if d["kind"] == "HTTPRoute"]
    assert len(routes) == 2
    for r in routes:
        jsonschema.validate(r, ROUTE_SCHEMA)
    for s in specs:
        host = f"{s.name}.{cfg.inference_gateway.domain}" if cfg.inference_gateway.domain \
            else "gateway.example.com"
        # the body-based router's header, set from the request body's model
        picked = _gateway_picks(routes, host, {MODEL_HEADER: s.model_name})
        assert picked == {f"{s.name}-pool"}, (s.name, picked)


def test_two_endpoints_that_a_gateway_cannot_tell_apart_are_one_line():
    with pytest.raises(ConfigError) as err:
        _two({})                                        # routeBy none: both take everything
    assert "inferenceGateway.routeBy = " in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError) as err:
        _two({"routeBy": "model"}, same_model=True)     # one model header for both
    assert "spec.modelName = " in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError) as err:
        _env("dev", inferenceGateway={**GATEWAY, "routeBy": "hostname"})
    assert "inferenceGateway.domain" in str(err.value)


def test_one_endpoint_on_a_gateway_takes_every_request_without_a_header():
    _, _, docs = rendered(*CASES[0])
    (route,) = [d for d in docs if d["kind"] == "HTTPRoute"]
    assert _gateway_picks([route], "any.example.com", {}) == {route["spec"]["rules"][0][
        "backendRefs"][0]["name"]}


def test_kvaware_on_the_gateway_is_said_in_one_line():
    cfg = _env("dev", inferenceGateway=GATEWAY)
    said = [w for w in fit_endpoint(cfg, parse_endpoint(cfg.name, "e.yaml", _raw("kvaware")))
            .warnings if "gateway path" in w]
    assert len(said) == 1 and "\n" not in said[0] and "routingStrategy" in said[0]
    plain = fit_endpoint(cfg, parse_endpoint(cfg.name, "e.yaml", _raw("prefixaware")))
    assert not [w for w in plain.warnings if "gateway path" in w]
