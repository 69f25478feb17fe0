"""The router pod's front and its NLB, as rendered: what the loopback tests cannot wait for
(timeouts of seconds to minutes) or cannot see (the load balancer's settings), asserted on the
Service, the Deployment and the front's config; the behaviour itself runs on loopback in
tests/e2e/test_router_front.py, the full-size attacks in `python -m bench.attacks`."""
from __future__ import annotations

import functools
import hashlib
import os
import re
import stat
import subprocess

import pytest

from k8s.router import REQUEST_TIMEOUT_S, memory_bytes
from k8s.router_front import (
    CLIENT_IDLE_S, KEY_DIGEST_ENV, LOAD_BALANCER_ENV, PARKED_RSS_PER_BODY_BYTE,
    ROUTER_MEMORY_SHARE, SMALL_BODY_BYTES, TLS_ENV, TLS_FILE, key_digest,
)
from k8s.secret_fetch import API_KEY_DIGEST_FILE, API_KEY_FILE
from tests.k8s.test_charts import _env, _facts, _spec

_LB = "service.beta.kubernetes.io/aws-load-balancer-"
NLB_TLS_IDLE_S = 350     # fixed on TLS listeners (AWS: "can't be modified")


@functools.lru_cache(maxsize=None)
def _pod(tls: bool = False, strategy: str = "prefixaware") -> dict:
    """The router's Service, Deployment, front config and NetworkPolicy for the dev seed
    endpoint, with the API key its stack gives it (and a TLS certificate)."""
    import dataclasses

    import cdk8s

    from k8s.serving import build_charts

    cfg = _env("dev")
    spec = _spec(cfg, strategy)
    if tls:
        arn = f"arn:{cfg.facts.partition}:acm:{cfg.region}:{cfg.account}:certificate/abc"
        spec = dataclasses.replace(spec, tls_certificate_arn=arn)
    facts = dataclasses.replace(_facts(cfg, spec), api_key_secret_arn="arn:secret:key")
    docs = [d for chart in build_charts(cdk8s.App(), cfg, (spec,), facts)
            for d in chart.to_json()]
    svc = next(d for d in docs if d["kind"] == "Service" and d["spec"].get("type") ==
               "LoadBalancer")
    deployment = next(d for d in docs if d["kind"] == "Deployment"
                      and d["metadata"]["name"].endswith("-router"))
    config = next(d for d in docs if d["kind"] == "ConfigMap"
                  and d["metadata"]["name"].endswith("-router-front"))
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy"
                  and d["metadata"]["name"].endswith("-router"))
    return {"svc": svc, "deployment": deployment, "config": config["data"]["haproxy.cfg"],
            "policy": policy}


def _containers(pod: dict) -> dict:
    spec = pod["deployment"]["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec["containers"] + spec.get("initContainers", [])}


def _seconds(config: str, keyword: str) -> int:
    return int(re.search(rf"^\s*{keyword} (\d+)s$", config, re.M).group(1))


def test_the_nlb_holds_a_quiet_request_as_long_as_the_router_allows_it():
    """The NLB cut a TCP flow quiet for 350 s (its default) though the router allows 600 s and
    the front 630 s. The TCP listener's idle timeout is set above the front's, which is above
    the router's; a TLS listener's is fixed at 350 s, so the front's TCP keepalives on idle
    client connections come well inside it (AWS: keepalive packets reset the idle timer)."""
    pod = _pod()
    annotations = pod["svc"]["metadata"]["annotations"]
    port = pod["svc"]["spec"]["ports"][0]["port"]
    idle = annotations[f"{_LB}listener-attributes.TCP-{port}"]
    (nlb_idle,) = re.fullmatch(r"tcp\.idle_timeout\.seconds=(\d+)", idle).groups()
    front = _seconds(pod["config"], "timeout server")
    assert 6000 >= int(nlb_idle) > front > REQUEST_TIMEOUT_S      # the NLB's range: 60-6000
    tls = _pod(tls=True)
    tls_annotations = tls["svc"]["metadata"]["annotations"]
    assert f"{_LB}ssl-cert" in tls_annotations
    assert not any("listener-attributes" in k for k in tls_annotations)   # not settable there
    for config in (pod["config"], tls["config"]):
        assert re.search(r"^\s*option clitcpka$", config, re.M)
        assert _seconds(config, "clitcpka-idle") < NLB_TLS_IDLE_S / 2
        assert _seconds(config, "clitcpka-intvl") < NLB_TLS_IDLE_S / 2


def test_the_front_sees_the_real_client_through_the_nlb():
    """Proxy protocol v2 on the NLB's target group, and the front requiring its header from
    exactly the addresses the NetworkPolicy admits as the load balancer, and from no one
    else (the kubelet's probes and in-cluster clients send none; the NLB's own health checks
    send one with command LOCAL)."""
    pod = _pod()
    assert pod["svc"]["metadata"]["annotations"][f"{_LB}proxy-protocol"] == "*"
    front = _containers(pod)["front"]
    env = {e["name"]: e["value"] for e in front["env"]}
    admitted = [p["ipBlock"]["cidr"] for rule in pod["policy"]["spec"]["ingress"]
                for p in rule["from"] if "ipBlock" in p]
    assert admitted and env[LOAD_BALANCER_ENV].split(" ") == admitted
    rules = [ln.strip() for ln in pod["config"].splitlines()]
    # `[*]`: HAProxy splits the variable into one pattern per CIDR (without it, two CIDRs are
    # one malformed address and the config does not load)
    assert f'tcp-request connection expect-proxy layer4 if {{ src "${{{LOAD_BALANCER_ENV}[*]}}" }}' \
        in rules
    # the per-address limits key on the address the header names (session rules run after it)
    track = rules.index("tcp-request session track-sc0 src")
    assert rules.index(next(r for r in rules if "expect-proxy" in r)) < track


def test_the_front_speaks_http1_bounds_bodies_and_cuts_clients_that_stop():
    """HTTP/1.1 only; a body's first buffer within seconds and no pause longer than
    CLIENT_IDLE_S after; a client that stops reading its stream cut after CLIENT_IDLE_S (it
    was 630 s, while vllm-router buffered the stream for it)."""
    config = _pod()["config"]
    assert re.search(r'^\s*bind "\$\{FRONT_BIND\}" proto h1 "\$\{FRONT_TLS\[\*\]\}"$', config,
                     re.M)
    # the TLS words (k8s/certificate.py) offer no ALPN: HTTP/1.1 over TLS too
    tls = {e["name"]: e["value"] for e in _containers(_pod())["front"]["env"]}.get(TLS_ENV, "")
    assert tls.split()[:2] == ["ssl", "crt"] and "alpn" not in tls and "h2" not in tls
    assert _seconds(config, "timeout client") == CLIENT_IDLE_S <= 10
    assert _seconds(config, "timeout http-request") <= 10
    assert re.search(r"^\s*http-request wait-for-body time (\d+)s$", config, re.M)
    assert _seconds(config, "timeout queue") <= 30


def test_the_routers_connections_are_capped_by_its_memory():
    """At most as many bodies in flight as fit ROUTER_MEMORY_SHARE of the router's memory at
    the measured cost per body byte: small ones and large ones queue separately."""
    pod = _pod()
    config = pod["config"]
    router = _containers(pod)["router"]
    limit = int(router["args"][router["args"].index("--max-payload-size") + 1])
    memory = memory_bytes(router["resources"]["limits"]["memory"])
    caps = dict(re.findall(r"^backend (\S+)\n\s+server router \S+ maxconn (\d+)$", config,
                           re.M))
    small, large = int(caps["router"]), int(caps["router_large"])
    assert f"use_backend router_large if {{ req.hdr_val(content-length) gt " \
           f"{SMALL_BODY_BYTES} }}" in config
    held = (small * SMALL_BODY_BYTES + large * limit) * PARKED_RSS_PER_BODY_BYTE
    assert held <= memory * ROUTER_MEMORY_SHARE
    assert large >= 32 and small >= 512


def test_front_logs_carry_no_query_string_and_no_header():
    config = _pod()["config"]
    (fmt,) = re.findall(r'^\s*log-format "(.*)"$', config, re.M)
    assert "%HPO" in fmt
    for leaky in ("%r", "%HU", "%HQ", "%hr", "%hrl", "%CC"):
        assert not re.search(re.escape(leaky) + r"\b", fmt.replace("%HPO", "")), leaky
    assert "option httplog" not in config and "capture" not in config


def test_the_front_checks_the_key_by_its_digest(tmp_path):
    """The key is in no ConfigMap: the router's init container writes the digest of
    `Bearer <key>` beside the key, the front reads it by KEY_DIGEST_ENV. The init container's
    own script runs here with a fake `aws` that prints a key."""
    pod = _pod()
    containers = _containers(pod)
    front, init = containers["front"], containers["fetch-api-key"]
    env = {e["name"]: e["value"] for e in front["env"]}
    assert env[KEY_DIGEST_ENV] == API_KEY_DIGEST_FILE
    assert f'-f "${{{KEY_DIGEST_ENV}}}"' in pod["config"]
    assert "http-request deny deny_status 401 unless probe or one_key key_ok" in pod["config"]
    mount = os.path.dirname(API_KEY_DIGEST_FILE)
    assert any(m["mountPath"] == mount and m["readOnly"] for m in front["volumeMounts"])
    key = "Ab3" * 16
    fake = tmp_path / "bin" / "aws"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' '{key}'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    shell, flag, script = init["command"]
    script = script.replace(API_KEY_DIGEST_FILE, str(tmp_path / "digest")) \
                   .replace(API_KEY_FILE, str(tmp_path / "key"))
    init_env = {e["name"]: e["value"] for e in init["env"]}
    init_env.update(OUT=str(tmp_path / "key"), DIGEST=str(tmp_path / "digest"),
                    PATH=f"{fake.parent}:{os.environ['PATH']}")
    subprocess.run([shell, flag, script], env=init_env, check=True, timeout=10)
    assert (tmp_path / "key").read_text() == key
    assert (tmp_path / "digest").read_text().strip() == key_digest(key) == \
        hashlib.sha256(f"Bearer {key}".encode()).hexdigest()


def test_vllm_router_logs_at_warn_by_its_tracing_filter():
    """vllm-router 0.1.17 parses `--log-level warning` (its launcher's only spelling) to INFO;
    RUST_LOG is what its EnvFilter reads first."""
    for strategy in ("session", "roundrobin", "kvaware"):
        router = _containers(_pod(strategy=strategy))["router"]
        assert router["command"][-1] == "vllm-router"
        assert {"name": "RUST_LOG", "value": "warn"} in router["env"]
        assert "--log-level" not in router["args"]
    sglang = _containers(_pod())["router"]
    assert sglang["args"][sglang["args"].index("--log-level") + 1] == "warn"


@pytest.mark.parametrize("strategy", ["prefixaware", "session"])
def test_probes_reach_the_router_without_a_key(strategy):
    """The kubelet's and the NLB's probes send no key: their paths are the front's open ones."""
    pod = _pod(strategy=strategy)
    router = _containers(pod)["router"]
    paths = {router[p]["httpGet"]["path"] for p in ("startupProbe", "readinessProbe",
                                                   "livenessProbe")}
    paths.add(pod["svc"]["metadata"]["annotations"][f"{_LB}healthcheck-path"])
    (probe_acl,) = re.findall(r"^\s*acl probe path (.*)$", pod["config"], re.M)
    assert paths <= set(probe_acl.split())


@pytest.mark.parametrize("cidrs", [("10.20.0.0/24",), ("10.20.0.0/24", "10.20.8.0/24",
                                                       "10.20.16.0/24")])
def test_the_front_loads_with_every_load_balancer_range_as_its_own_pattern(tmp_path, cidrs):
    """An existing VPC's load balancer subnets are several ranges: the rendered config must load
    in the real HAProxy with the variable as the pod sets it (`${VAR[*]}` splits it; a quoted
    `${VAR}` would be one malformed address and HAProxy would refuse to start)."""
    pod = _pod()
    (tmp_path / "haproxy.cfg").write_text(pod["config"])
    (tmp_path / "digest").write_text(key_digest("k") + "\n")
    env = {e["name"]: e["value"] for e in _containers(pod)["front"]["env"]}
    env.update({LOAD_BALANCER_ENV: " ".join(cidrs), KEY_DIGEST_ENV: str(tmp_path / "digest")})
    if TLS_ENV in env:   # the certificate the Job makes, at a path of the test's
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(tmp_path / "key"),
                        "-out", str(tmp_path / "crt"), "-days", "1", "-subj", "/CN=front"],
                       check=True, capture_output=True)
        (tmp_path / "front.pem").write_bytes((tmp_path / "crt").read_bytes()
                                             + (tmp_path / "key").read_bytes())
        env[TLS_ENV] = env[TLS_ENV].replace(TLS_FILE, str(tmp_path / "front.pem"))
    check = subprocess.run(["haproxy", "-c", "-f", str(tmp_path / "haproxy.cfg")],
                           env={**os.environ, **env}, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
