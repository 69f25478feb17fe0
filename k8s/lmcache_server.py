"""HyperPod's `lmcache.mode: MultiProcess` on EKS: `lmcache server` beside vLLM in the worker pod.

Read in LMCache 0.5.4, the release lmcache/vllm-openai v0.5.4 carries (lmcache/cli/commands/
server.py and the argument groups it composes: v1/multiprocess/config.py add_mp_server_args and
add_http_frontend_args, v1/distributed/config.py add_storage_manager_args with
l2_adapters/config.py `--l2-adapter`, v1/mp_observability/config.py), and the vLLM side,
integration/vllm/lmcache_mp_connector.py `LMCacheMPConnector`:
- The server holds L1 (`--l1-size-gb`, required, with `--eviction-policy`, required: LRU here,
  what the in-process L1 does) and the L2 adapters; vLLM holds only the connector, which finds
  the server by `kv_connector_extra_config` `lmcache.mp.host` / `lmcache.mp.port` (ZMQ).
- How KV moves: by default a CUDA worker hands the server CUDA IPC handles and the server copies
  (`lmcache_driven`), which needs the GPU in the server's container; the device plugin gives a
  GPU to one container of a pod only. So the transfer is `engine_driven`: vLLM's worker copies
  its KV into the server's L1, a POSIX shared-memory segment (`--shm-name`) in the pod's
  memory-backed /dev/shm, which both containers mount (`lmcache.mp.mp_transfer_mode`,
  v1/multiprocess/transfer_context/worker_transfer.py). The server needs no GPU.
- The L2 verdict (k8s/l2.py) is the same as in-process; the connector it chose becomes the
  server's L2 adapter of the same protocol: the native RESP client (`resp`, what `resp://`
  is in-process; a plain `redis://` Valkey speaks the same protocol). 0.5.4's server has no
  RESP client with TLS but GLIDE's (`valkey`, not in the published images) and no `lm://`
  client, so an L2 over TLS, with a password, or on an LMCache server is refused for
  MultiProcess in one line.
- Everything listens on 127.0.0.1 (ZMQ, its HTTP frontend, its metrics): only vLLM talks to it.
It runs as a native sidecar (an init container with `restartPolicy: Always`): the kubelet starts
it, and waits for its startup probe, before vLLM, whose connector connects at engine start; and
stops it only after vLLM has drained, whose last stores go to it.

Upstream threads read: LMCache #2128 (its Kubernetes sidecar example gives the server the
pod's GPUs and hostIPC for the default CUDA IPC path: what engine_driven avoids here), #4213
(an MP server needs LMCacheMPConnector, not LMCacheConnectorV1), #4114 (MP has no HyperPod L2
adapter: HyperPod's MP keeps its CPU L1), #3928 (docs drift: `mp_transfer_mode` routing swapped
in #3679), #3262 (MP is node-local), kaito-project/kaito #2363/#2364 (MP is LMCache's
recommended mode), aws/sagemaker-hyperpod-cli #464 (operator v3.7 `lmcache.mode`).
"""
from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from config.contracts import LMCACHE_SERVER_HTTP_PORT, LMCACHE_SERVER_PORT

LMCACHE_MP_SINCE = (0, 5, 0)
SHM_NAME = "kvcache-l1"
SERVER_METRICS_PORT = 8092          # its Prometheus endpoint, on loopback (not scraped)
SERVER_CPU = "2"
SERVER_OVERHEAD_GIB = 2             # the server process beside its L1
MP_CONNECTOR_MODULE = "lmcache.integration.vllm.lmcache_mp_connector"


def mp_refusal(endpoint: str, l2_url: str | None, l2_secret: bool) -> str | None:
    """Why this endpoint's L2 cannot be the server's (module docstring); None where it can."""
    if l2_url is None:
        return None
    scheme = urlsplit(l2_url).scheme
    if scheme in ("resp", "redis") and not l2_secret:
        return None
    return (f"endpoint {endpoint}: spec.lmcache.mode MultiProcess: its L2 ({scheme}://"
            f"{' with a password' if l2_secret else ''}) has no adapter in LMCache 0.5.4's "
            "server (it reaches Redis/Valkey by plain RESP only; TLS needs valkey-glide, not "
            "in the image); allowed: InProcess, or an L2 on the in-cluster Valkey")


def l2_adapter(l2_url: str) -> dict[str, Any]:
    """The server's `--l2-adapter` for the L2 the in-process worker would reach."""
    parts = urlsplit(l2_url)
    return {"type": "resp", "host": parts.hostname, "port": parts.port or 6379}


def server_args(l1_gib: int, chunk_tokens: int, l2_url: str | None) -> list[str]:
    """`lmcache server`'s arguments (checked against the release's own parser in
    tests/k8s/test_lmcache_server.py)."""
    args = ["server", "--host", "127.0.0.1", "--port", str(LMCACHE_SERVER_PORT),
            "--chunk-size", str(chunk_tokens),
            "--l1-size-gb", str(l1_gib), "--eviction-policy", "LRU",
            "--supported-transfer-mode", "engine_driven", "--shm-name", SHM_NAME,
            "--http-host", "127.0.0.1", "--http-port", str(LMCACHE_SERVER_HTTP_PORT),
            "--prometheus-port", str(SERVER_METRICS_PORT)]
    if l2_url:
        args += ["--l2-adapter", json.dumps(l2_adapter(l2_url), separators=(",", ":"))]
    return args


def mp_kv_transfer_config() -> dict[str, Any]:
    """vLLM's `--kv-transfer-config` for the connector that talks to the server."""
    return {"kv_connector": "LMCacheMPConnector", "kv_connector_module_path": MP_CONNECTOR_MODULE,
            "kv_role": "kv_both", "kv_connector_extra_config": {
                "lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": LMCACHE_SERVER_PORT,
                "lmcache.mp.mp_transfer_mode": "engine_driven"}}


def server_container(*, image: str, python: str, args: list[str], memory_gib: int,
                     security_context: dict, mounts: list[dict], env: list[dict]) -> dict:
    """The native sidecar: the image's own LMCache CLI (`python -m lmcache.cli.main`)."""
    memory = f"{memory_gib}Gi"
    return {
        "name": "lmcache-server", "image": image, "imagePullPolicy": "IfNotPresent",
        "restartPolicy": "Always",
        "command": [python, "-m", "lmcache.cli.main"], "args": args,
        "env": [{"name": "LMCACHE_TRACK_USAGE", "value": "false"},
                {"name": "DO_NOT_TRACK", "value": "1"}, *env],
        # the kubelet cannot reach 127.0.0.1 of the pod with tcpSocket: an exec probe instead
        "startupProbe": {"exec": {"command": [python, "-c", _PROBE]},
                         "periodSeconds": 2, "failureThreshold": 150},
        "livenessProbe": {"exec": {"command": [python, "-c", _PROBE]}, "periodSeconds": 10,
                          "timeoutSeconds": 5},
        "volumeMounts": mounts,
        "resources": {"requests": {"cpu": SERVER_CPU, "memory": memory},
                      "limits": {"memory": memory}},
        "securityContext": security_context,
    }


# The server's HTTP frontend answers on loopback once it is up.
_PROBE = ("import socket; socket.create_connection(('127.0.0.1', "
          f"{LMCACHE_SERVER_HTTP_PORT}), 2).close()")
