"""Secrets Manager values fetched at pod start into a memory volume of the one pod that uses
them (Pod Identity): the endpoint API key here, the Grafana admin password in k8s/monitoring.py.

The endpoint API key:
Clients send it as `Authorization: Bearer`. vllm-router 0.1.17 checks no client key (measured
on loopback): it forwards the client's header to the worker, where vLLM checks it
(VLLM_API_KEY, on every /v1 route), and sends its own `--api-key` on the calls it makes itself
(render/tokenize for cache_aware). No manifest, template or log line carries the value.
"""
from __future__ import annotations

from dataclasses import dataclass

from k8s.objects import hardened

SECRETS_DIR = "/run/secrets/kvcache"
API_KEY_FILE = f"{SECRETS_DIR}/api-key"


@dataclass(frozen=True)
class ApiKey:
    """Where the key lives; the pod's service account reads it through Pod Identity."""

    secret_arn: str
    region: str
    fetch_image: str                  # aws-cli


def fetch_secret_container(*, name: str, image: str, region: str, secret_arn: str,
                           out_file: str, volume: str, run_as_user: int | None) -> dict:
    """Init container: the secret's value into `out_file` (mode 0600) on the memory volume
    `volume`, mounted at the file's directory; the aws CLI writes its own state to `fetch-tmp`."""
    return {
        "name": name, "image": image, "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c",
                    "set -eu; umask 077; VALUE=$(aws secretsmanager get-secret-value "
                    "--secret-id \"$SECRET_ARN\" --query SecretString --output text); "
                    "printf '%s' \"$VALUE\" > \"$OUT\""],
        "env": [{"name": "AWS_REGION", "value": region},
                {"name": "SECRET_ARN", "value": secret_arn},
                {"name": "OUT", "value": out_file},
                {"name": "HOME", "value": "/tmp"}],
        "volumeMounts": [{"name": volume, "mountPath": out_file.rsplit("/", 1)[0]},
                         {"name": "fetch-tmp", "mountPath": "/tmp"}],
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"},
                      "limits": {"cpu": "500m", "memory": "256Mi"}},
        "securityContext": hardened(read_only_root=True, run_as_user=run_as_user),
    }


def fetch_api_key_container(key: ApiKey, run_as_user: int | None) -> dict:
    return fetch_secret_container(name="fetch-api-key", image=key.fetch_image, region=key.region,
                                  secret_arn=key.secret_arn, out_file=API_KEY_FILE,
                                  volume="api-key", run_as_user=run_as_user)


API_KEY_VOLUMES = [{"name": "api-key", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                   {"name": "fetch-tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}}]
