"""The worker reaper: a sidecar beside sglang-router 0.3.2 when it discovers its workers, which
removes the workers whose pod is gone (k8s/worker_reaper_agent.py says why and how).

The agent is a standard-library script shipped in a ConfigMap and run by the router image's
own Python, so the image needs nothing new; a change to the script rolls the pods (the
Deployment's annotation carries its hash).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from config.contracts import ROUTER_BACKEND_PORT
from k8s.objects import hardened

AGENT = Path(__file__).with_name("worker_reaper_agent.py")
REAPER_DIR = "/etc/kvcache-reaper"
REAPER_SCRIPT = "worker_reaper.py"
# Seconds between sweeps: a deleted worker's URL is out of the router within this (plus one
# LIST), well inside the VPC CNI's cool-down before a released pod IP is given out again
# (30 s by default), so the router never meets the IP's next owner; a LIST of one endpoint's
# pods every 5 s per router replica is little for the API server.
REAPER_INTERVAL_S = 5
REAPER_CPU, REAPER_MEMORY = "50m", "48Mi"
# Liveness: every sweep (failed or not, each call bounded by the agent's TIMEOUT_S) touches a
# file; older than this, the loop is stuck and the kubelet restarts the container. No readiness
# probe: the router serves without the reaper, so the pod must not leave the NLB over it.
HEARTBEAT_DIR = "/run/kvcache-reaper"
HEARTBEAT = f"{HEARTBEAT_DIR}/alive"
HEARTBEAT_STALE_S = 60


def agent_text() -> str:
    return AGENT.read_text()


def agent_hash() -> str:
    """A pod annotation: a new script rolls the pods (a ConfigMap change alone does not)."""
    return hashlib.sha256(agent_text().encode()).hexdigest()[:16]


def reaper_args(namespace: str, selector: dict[str, str], worker_port: int,
                key_file: str | None) -> list[str]:
    args = ["--router", f"http://127.0.0.1:{ROUTER_BACKEND_PORT}", "--namespace", namespace,
            "--selector", ",".join(f"{k}={v}" for k, v in sorted(selector.items())),
            "--port", str(worker_port), "--interval", str(REAPER_INTERVAL_S),
            "--heartbeat", HEARTBEAT]
    return args + (["--key-file", key_file] if key_file else [])


HEARTBEAT_VOLUME = {"name": "worker-reaper-heartbeat",
                    "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}


def reaper_container(image: str, config_volume: str, args: list[str],
                     key_mount: dict | None) -> dict:
    """The sidecar: the router image's python3 running the ConfigMap's script with ``args``;
    ``key_mount`` the router's own mount of the endpoint key, if it has one. The pod adds
    HEARTBEAT_VOLUME."""
    mounts = [{"name": config_volume, "mountPath": REAPER_DIR, "readOnly": True},
              {"name": HEARTBEAT_VOLUME["name"], "mountPath": HEARTBEAT_DIR}]
    stale = (f"import os, sys, time; sys.exit(time.time() - os.stat({HEARTBEAT!r}).st_mtime "
             f"> {HEARTBEAT_STALE_S})")
    return {
        "name": "worker-reaper", "image": image, "imagePullPolicy": "IfNotPresent",
        "command": ["python3", f"{REAPER_DIR}/{REAPER_SCRIPT}"], "args": args,
        "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
        "volumeMounts": mounts + ([key_mount] if key_mount else []),
        "livenessProbe": {"exec": {"command": ["python3", "-c", stale]},
                          "initialDelaySeconds": HEARTBEAT_STALE_S, "periodSeconds": 30,
                          "timeoutSeconds": 10},
        "resources": {"requests": {"cpu": REAPER_CPU, "memory": REAPER_MEMORY},
                      "limits": {"cpu": REAPER_CPU, "memory": REAPER_MEMORY}},
        "securityContext": hardened(),
    }
