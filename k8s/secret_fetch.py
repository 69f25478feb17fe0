"""Secrets Manager values fetched at pod start into a memory volume of the one pod that uses
them (Pod Identity): the endpoint API key here, the Grafana admin password in k8s/monitoring.py.

The endpoint API key:
Clients send it as `Authorization: Bearer`. The router pod's front checks it against the
SHA-256 of `Bearer <key>` (API_KEY_DIGEST_FILE, written beside the key by the router's init
container; k8s/router_front.py); vLLM checks it again (VLLM_API_KEY, on every /v1 route). The
routers send their own `--api-key` on the calls they make themselves (render/tokenize for
cache_aware and kv_aware). No manifest, template or log line carries the value.
"""
from __future__ import annotations

from dataclasses import dataclass

from k8s.objects import hardened

SECRETS_DIR = "/run/secrets/kvcache"
API_KEY_FILE = f"{SECRETS_DIR}/api-key"
API_KEY_DIGEST_FILE = f"{SECRETS_DIR}/api-key.sha256"
# Appended to the fetch script: the hex SHA-256 of `Bearer <key>` into $DIGEST; a digest that
# is not 64 characters (no sha256sum in the image) fails the init container, so the pod never
# starts with a front that would refuse every client.
_DIGEST_SCRIPT = ('; D=$(printf \'Bearer %s\' "$VALUE" | sha256sum); D=${D%% *}; '
                  '[ ${#D} -eq 64 ]; printf \'%s\\n\' "$D" > "$DIGEST"')


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


def fetch_api_key_container(key: ApiKey, run_as_user: int | None, *,
                            bearer_digest: bool = False) -> dict:
    """The key into API_KEY_FILE; with ``bearer_digest`` also its front's digest into
    API_KEY_DIGEST_FILE (the aws-cli image is Amazon Linux 2, whose coreutils has sha256sum)."""
    container = fetch_secret_container(
        name="fetch-api-key", image=key.fetch_image, region=key.region,
        secret_arn=key.secret_arn, out_file=API_KEY_FILE, volume="api-key",
        run_as_user=run_as_user)
    if bearer_digest:
        container["command"][-1] += _DIGEST_SCRIPT
        container["env"].append({"name": "DIGEST", "value": API_KEY_DIGEST_FILE})
    return container


API_KEY_VOLUMES = [{"name": "api-key", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                   {"name": "fetch-tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}}]
