"""The router front's own TLS certificate, made in the cluster, as HyperPod makes one
(`tlsConfig.tlsCertificateOutputS3Uri`): for every endpoint without an ACM certificate, unless
the environment says `listener.generatedCertificate: false`.

ACM issues no public certificate in the China regions and cert-manager is not installed, so
the certificate is made by a Job of the router image (its Debian base carries `openssl`, its
Python the standard library that talks to the Kubernetes API): an EC P-256 key and a
self-signed certificate naming the Service and the region's NLB names (`*.elb.<region>.
<domain>`), valid VALID_DAYS. The key is written only into the endpoint's Secret, through the
API, by the Job's service account, which may read and update that one Secret and patch that
one Deployment; it is in no manifest, template, log or S3 object. The certificate (the public
part) goes to the Secret for the front and to the S3 URI for clients to trust, where the file
names one (`aws s3 cp` by the aws-cli image, with a Pod Identity allowed only that object).

Renewal: a CronJob runs the same pod daily; a certificate that expires within RENEW_DAYS is
replaced, and the router Deployment's template annotation changes, so its pods roll (the front
reads the certificate at start) with their usual drain. The Job at deploy is named by a hash of
its pod, so a changed one runs again (a Job's pod is immutable).
"""
from __future__ import annotations

import hashlib
import json

from constructs import Construct

from k8s.objects import account_role, hardened, k8s_object, pod_security

VALID_DAYS = 397          # what browsers accept for a public certificate; renewed well before
RENEW_DAYS = 30
CN_MAX = 64               # X.509's upper bound on a common name (RFC 5280)
SCHEDULE = "17 3 * * *"   # daily
PUBLIC_DIR = "/run/certificate"
PUBLIC_FILE = f"{PUBLIC_DIR}/tls.crt"
SECRET_KEYS = ("tls.crt", "front.pem")   # the public certificate; certificate + key (HAProxy)
# Environment of the script, by name, so a loopback test runs the text unchanged against its
# own API server.
API_ENV, TOKEN_ENV = "KUBE_API", "KUBE_TOKEN_FILE"

SCRIPT = """\
import base64, hashlib, json, os, ssl, subprocess, sys, tempfile, urllib.error, urllib.request
e = os.environ
api = e.get("KUBE_API", "https://kubernetes.default.svc")
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
token = open(e.get("KUBE_TOKEN_FILE", sa + "/token")).read().strip()
ctx = ssl.create_default_context(cafile=sa + "/ca.crt") if api.startswith("https") else None
ns, names = e["NAMESPACE"], e["DNS_NAMES"].split()
def call(method, path, body=None, kind="application/json"):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(api + path, data=data, method=method, headers={
        "Authorization": "Bearer " + token, "Content-Type": kind})
    with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
        return json.load(r)
path = "/api/v1/namespaces/%s/secrets/%s" % (ns, e["SECRET"])
secret = call("GET", path)
crt = base64.b64decode((secret.get("data") or {}).get("tls.crt", ""))
def lasts(pem):
    with tempfile.NamedTemporaryFile() as f:
        f.write(pem)
        f.flush()
        return subprocess.run(["openssl", "x509", "-noout", "-checkend",
                               str(int(e["RENEW_DAYS"]) * 86400), "-in", f.name],
                              capture_output=True).returncode == 0
if crt and lasts(crt):
    print("certificate valid beyond", e["RENEW_DAYS"], "days")
else:
    with tempfile.TemporaryDirectory() as d:
        made = subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-keyout", d + "/key", "-out", d + "/crt", "-days", e["VALID_DAYS"],
             "-subj", "/CN=" + e["COMMON_NAME"],
             "-addext", "subjectAltName=" + ",".join("DNS:" + n for n in names)],
            capture_output=True, text=True)
        if made.returncode:   # one line that says why, in the Job's log
            sys.exit("openssl req: " + (made.stderr.strip().splitlines() or ["failed"])[-1])
        crt, key = open(d + "/crt", "rb").read(), open(d + "/key", "rb").read()
    secret["data"] = {"tls.crt": base64.b64encode(crt).decode(),
                      "front.pem": base64.b64encode(crt + key).decode()}
    del key
    call("PUT", path, secret)   # with its resourceVersion: a concurrent run fails, not overwrites
    try:   # the front reads its certificate at start: roll the router pods
        call("PATCH", "/apis/apps/v1/namespaces/%s/deployments/%s" % (ns, e["DEPLOYMENT"]),
             {"spec": {"template": {"metadata": {"annotations": {
                 "kvcache.io/certificate": hashlib.sha256(crt).hexdigest()[:16]}}}}},
             "application/strategic-merge-patch+json")
    except urllib.error.HTTPError as err:
        if err.code != 404:   # not created yet: its pods will read the new certificate
            raise
    print("certificate made, valid", e["VALID_DAYS"], "days")
open(e["PUBLIC_OUT"], "wb").write(crt)
"""


def secret_name(router: str) -> str:
    return f"{router}-tls"


def dns_names(router: str, namespace: str, region: str, domain_suffix: str) -> tuple[str, ...]:
    """What clients call the front by: the Service in the cluster, and the NLB's name
    (`<name>-<id>.elb.<region>.<domain>`, one DNS label before `.elb`)."""
    return (f"{router}.{namespace}.svc.cluster.local", f"{router}.{namespace}.svc",
            f"{router}.{namespace}", router, f"*.elb.{region}.{domain_suffix}")


def common_name(router: str, names: tuple[str, ...]) -> str:
    """The subject's CN: the router's own name, which is one DNS label (at most 63), where
    the Service's full name may pass the 64 characters X.509 allows a CN (RFC 5280 ub-common-
    name; OpenSSL refuses it, "string too long"). Clients match the subjectAltNames, which
    carry every name; the CN is only a label."""
    if router not in names or len(router) > CN_MAX:
        raise ValueError(f"{router}: not a name the certificate carries, or over {CN_MAX}")
    return router


def s3_object(uri: str, endpoint: str) -> str:
    """Where the certificate goes: the URI itself if it names a .pem, else
    `<uri>/<endpoint>.pem`."""
    return uri if uri.endswith(".pem") else f"{uri.rstrip('/')}/{endpoint}.pem"


def cert_service_account(router: str) -> str:
    return f"{router}-cert"


def certificate_objects(scope: Construct, *, router: str, endpoint: str, namespace: str,
                        labels: dict, image: str, aws_cli_image: str, region: str,
                        names: tuple[str, ...], s3_uri: str | None) -> None:
    """The empty Secret the Job fills, its service account and Role, the Job and the CronJob."""
    sa, secret = cert_service_account(router), secret_name(router)
    # Rendered without data: `kubectl apply` of it never removes what the Job wrote.
    k8s_object(scope, "TlsSecret", api_version="v1", kind="Secret", name=secret,
               namespace=namespace, labels=labels, body={"type": "Opaque"})
    k8s_object(scope, "CertAccount", api_version="v1", kind="ServiceAccount", name=sa,
               namespace=namespace, labels=labels, body={"automountServiceAccountToken": False})
    account_role(scope, "Cert", name=sa, namespace=namespace, labels=labels, rules=[
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [secret],
         "verbs": ["get", "update"]},
        {"apiGroups": ["apps"], "resources": ["deployments"], "resourceNames": [router],
         "verbs": ["patch"]}])
    make = {
        "name": "make-certificate", "image": image, "imagePullPolicy": "IfNotPresent",
        "command": ["python3", "-c", SCRIPT],
        "env": [{"name": "NAMESPACE", "value": namespace}, {"name": "SECRET", "value": secret},
                {"name": "DEPLOYMENT", "value": router},
                {"name": "DNS_NAMES", "value": " ".join(names)},
                {"name": "COMMON_NAME", "value": common_name(router, names)},
                {"name": "VALID_DAYS", "value": str(VALID_DAYS)},
                {"name": "RENEW_DAYS", "value": str(RENEW_DAYS)},
                {"name": "PUBLIC_OUT", "value": PUBLIC_FILE}],
        "volumeMounts": [{"name": "public", "mountPath": PUBLIC_DIR},
                         {"name": "tmp", "mountPath": "/tmp"},   # openssl's files (read-only root)
                         {"name": "token", "mountPath":
                          "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": True}],
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                      "limits": {"cpu": "500m", "memory": "128Mi"}},
        "securityContext": hardened(),
    }
    steps = [make]
    if s3_uri:
        steps.append({
            "name": "write-s3", "image": aws_cli_image, "imagePullPolicy": "IfNotPresent",
            "command": ["aws", "s3", "cp", "--only-show-errors", PUBLIC_FILE,
                        s3_object(s3_uri, endpoint)],
            "env": [{"name": "AWS_REGION", "value": region}, {"name": "HOME", "value": "/tmp"}],
            "volumeMounts": [{"name": "public", "mountPath": PUBLIC_DIR, "readOnly": True},
                             {"name": "tmp", "mountPath": "/tmp"}],
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                          "limits": {"cpu": "500m", "memory": "256Mi"}},
            "securityContext": hardened(),
        })
    pod = {"spec": {
        "serviceAccountName": sa, "automountServiceAccountToken": False,
        "restartPolicy": "OnFailure", "securityContext": pod_security(),
        # the make step first (an init container), the upload after it
        "initContainers": steps[:-1], "containers": steps[-1:],
        "volumes": [{"name": "public", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                    {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
                    # the API token only in this pod's make step (projected, short-lived)
                    {"name": "token", "projected": {"sources": [
                        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
                        {"configMap": {"name": "kube-root-ca.crt",
                                       "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}}]}}
    job = {"backoffLimit": 6, "ttlSecondsAfterFinished": 86400, "template": pod}
    digest = hashlib.sha256(json.dumps(job, sort_keys=True).encode()).hexdigest()[:8]
    k8s_object(scope, "CertJob", api_version="batch/v1", kind="Job",
               name=f"{router}-cert-{digest}", namespace=namespace, labels=labels,
               body={"spec": job})
    k8s_object(scope, "CertRenewal", api_version="batch/v1", kind="CronJob",
               name=f"{router}-cert", namespace=namespace, labels=labels, body={"spec": {
                   "schedule": SCHEDULE, "concurrencyPolicy": "Forbid",
                   "successfulJobsHistoryLimit": 1, "failedJobsHistoryLimit": 3,
                   "jobTemplate": {"spec": job}}})
