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


def agent_text() -> str:
    return AGENT.read_text()


def agent_hash() -> str:
    """A pod annotation: a new script rolls the pods (a ConfigMap change alone does not)."""
    return hashlib.sha256(agent_text().encode()).hexdigest()[:16]


def reaper_args(namespace: str, selector: dict[str, str], worker_port: int,
                key_file: str | None) -> list[str]:
    args = ["--router", f"http://127.0.0.1:{ROUTER_BACKEND_PORT}", "--namespace", namespace,
            "--selector", ",".join(f"{k}={v}" for k, v in sorted(selector.items())),
            "--port", str(worker_port), "--interval", str(REAPER_INTERVAL_S)]
    return args + (["--key-file", key_file] if key_file else [])


def reaper_container(image: str, config_volume: str, args: list[str],
                     key_mount: dict | None) -> dict:
    """The sidecar: the router image's python3 running the ConfigMap's script with ``args``;
    ``key_mount`` the router's own mount of the endpoint key, if it has one."""
    mounts = [{"name": config_volume, "mountPath": REAPER_DIR, "readOnly": True}]
    return {
        "name": "worker-reaper", "image": image, "imagePullPolicy": "IfNotPresent",
        "command": ["python3", f"{REAPER_DIR}/{REAPER_SCRIPT}"], "args": args,
        "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
        "volumeMounts": mounts + ([key_mount] if key_mount else []),
        "resources": {"requests": {"cpu": REAPER_CPU, "memory": REAPER_MEMORY},
                      "limits": {"cpu": REAPER_CPU, "memory": REAPER_MEMORY}},
        "securityContext": hardened(),
    }
