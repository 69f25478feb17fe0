"""The EFA device plugin's pod as the EKS add-on registry's chart renders it, recorded.

CI reaches no chart repository, so the pod spec the pinned chart renders (eks-charts
`stable/aws-efa-k8s-device-plugin`, the chart version whose appVersion is the image
config/images.py pins) is recorded by the real `helm template` (Helm from the CDK kubectl
layer) and checked in as tests/fixtures/efa-device-plugin.json:

    python -m tests.k8s.efa_chart --chart DIR [--commit SHA]   # DIR: the chart's source

k8s/efa_device_plugin.py renders the same privileges, host paths and priority
(tests/k8s/test_efa_device_plugin.py holds it to the recording).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from tests.stacks.helm_pods import helm_binary

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "efa-device-plugin.json"
# what decides what the plugin may do on the node; its instance list and labels are not ours
# to copy (our nodeSelector names the EFA groups)
_POD_KEYS = ("hostNetwork", "priorityClassName", "tolerations", "automountServiceAccountToken",
             "volumes", "securityContext")
_CONTAINER_KEYS = ("image", "securityContext", "volumeMounts", "resources")


def record(chart: Path, commit: str | None) -> dict:
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        helm = helm_binary(Path(tmp))
        out = subprocess.run([str(helm), "template", meta["name"], str(chart), "--namespace",
                              "kube-system"], capture_output=True, text=True, timeout=120,
                             check=True).stdout
    (ds,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return {"chart": meta["name"], "version": meta["version"], "appVersion": meta["appVersion"],
            "source": f"aws/eks-charts{'@' + commit if commit else ''}",
            "pod": {k: pod[k] for k in _POD_KEYS if k in pod},
            "container": {k: container[k] for k in _CONTAINER_KEYS if k in container}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chart", type=Path, required=True)
    parser.add_argument("--commit")
    args = parser.parse_args(argv)
    FIXTURE.write_text(json.dumps(record(args.chart, args.commit), indent=1, sort_keys=True)
                       + "\n")
    print(f"wrote {FIXTURE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
