"""Send one request to an endpoint through its router, as a client would, and say what is wrong.

    python -m tools smoke --env dev --endpoint llama-8b-intel-routing --url https://HOST:8000
        --ca-file front-ca.pem   (one line)

Without an ACM certificate the router's front serves HTTPS with the endpoint's own certificate
(k8s/certificate.py): `--ca-file` is that certificate, as written to the endpoint's
tlsCertificateOutputS3Uri (`aws s3 cp s3://BUCKET/PREFIX/<endpoint>.pem front-ca.pem`) or read
from the cluster (`kubectl -n kvcache-serving get secret <endpoint>-router-tls -o
jsonpath='{.data.tls\\.crt}' | base64 -d > front-ca.pem`).

The key is the Serving stack's API key (`ApiKeySecretArn`, read from Secrets Manager), or
`--api-key-env VAR`. One streamed chat completion for the endpoint's model; the time to its
first token is printed. A failure is one line naming the likely cause: an unreachable load
balancer, a refused key, a model name vLLM does not serve, or no worker ready yet.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from config.arguments import ToolError, add_command, base_url, key_from_env, out_console, \
    pick_endpoint, load_environment
from config.errors import excerpt
from tools.cli import Aws, load_endpoints


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "smoke", main, "send one request through an endpoint's router and say "
                    "what is wrong", __doc__)
    p.add_argument("--endpoint", metavar="NAME", help="the endpoint (needed when the "
                   "environment serves more than one)")
    p.add_argument("--url", type=base_url, required=True,
                   help="the router's load balancer, e.g. https://HOSTNAME:8000")
    p.add_argument("--api-key-env", metavar="VAR",
                   help="read the key from this variable instead of Secrets Manager")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds (default 60)")
    p.add_argument("--ca-file", metavar="PEM", help="the certificate to trust for https:// "
                   "(the endpoint's own, from its tlsCertificateOutputS3Uri or Secret)")


def api_key(args: argparse.Namespace, aws: Aws) -> str:
    if args.api_key_env:
        return key_from_env(args.api_key_env)
    arn = aws.stack_output("Serving", "ApiKeySecretArn")
    return aws.client("secretsmanager").get_secret_value(SecretId=arn)["SecretString"]


def main(args: argparse.Namespace, aws: Aws | None = None) -> int:
    import requests

    cfg = load_environment(args)
    spec = pick_endpoint(cfg, load_endpoints(cfg), args.endpoint)
    if args.ca_file and not Path(args.ca_file).is_file():
        raise ToolError.bad_input("--ca-file", args.ca_file, "a PEM file that exists")
    if not 0 < args.timeout <= 600:
        raise ToolError.bad_input("--timeout", args.timeout, "seconds above 0, at most 600")
    key = api_key(args, aws or Aws(cfg, args.profile))
    url = f"{args.url.rstrip('/')}/v1/chat/completions"
    body = {"model": spec.model_name, "max_tokens": 8, "stream": True,
            "messages": [{"role": "user", "content": "Say hello."}]}
    start = time.monotonic()
    try:
        with requests.post(url, json=body, stream=True, timeout=args.timeout,
                           verify=args.ca_file or True,
                           headers={"Authorization": f"Bearer {key}"}) as resp:
            if resp.status_code != 200:
                raise ToolError(_diagnosis(spec, resp.status_code, resp.text[:2000]))
            first, chunks = None, 0
            for line in resp.iter_lines():
                if line.startswith(b"data: ") and line != b"data: [DONE]":
                    first = first or time.monotonic()
                    chunks += 1
    except requests.exceptions.SSLError:
        raise ToolError(f"{args.url}: its certificate is not trusted here: the front's own "
                        "certificate is the endpoint's (--ca-file: from the endpoint's "
                        "tlsCertificateOutputS3Uri, or kubectl -n kvcache-serving get secret "
                        f"{spec.name}-router-tls -o jsonpath='{{.data.tls\\.crt}}' | "
                        "base64 -d)") from None
    except requests.RequestException as err:
        raise ToolError(f"cannot reach {args.url}: {type(err).__name__}: an internal load "
                        "balancer answers only inside the VPC (or through a connection into "
                        f"it); check the hostname: kubectl -n kvcache-serving get service "
                        f"{spec.name}-router") from None
    if first is None:
        raise ToolError(f"{spec.name}: HTTP 200 but no streamed token came back")
    out_console.print(f"ok: {spec.name} ({spec.model_name}) answered: first token after "
                      f"{(first - start) * 1000:.0f} ms, {chunks} chunks")
    return 0


def _diagnosis(spec, status: int, text: str) -> str:
    try:
        detail = json.loads(text)
    except ValueError:
        detail = text
    said = excerpt(detail, 120)
    if status in (401, 403):
        return (f"{spec.name}: the router refused the key (HTTP {status}): pods read it when "
                f"they start; after a rotation restart them (kubectl -n kvcache-serving "
                f"rollout restart deployment {spec.name}-router {spec.name}-workers)")
    if status == 404:
        return (f"{spec.name}: HTTP 404 for model {spec.model_name!r}: the endpoint file's "
                f"modelName must be what vLLM serves ({said})")
    if status in (502, 503, 504):
        return (f"{spec.name}: no worker answered (HTTP {status}): workers may still be "
                "starting or staging weights: kubectl -n kvcache-serving get pods")
    return f"{spec.name}: HTTP {status}: {said}"
