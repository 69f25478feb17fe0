"""The EFA device plugin runs as the pinned chart runs its image (tests/fixtures/efa-device-
plugin.json, recorded by real helm from eks-charts): the same privileges, host paths, network
and priority. A plugin rendered with less cannot read the accelerator/EFA topology it hands
cards out by (eks-charts #1245); one rendered with more is not what AWS ships."""
from __future__ import annotations

import json

import cdk8s

from config.images import IMAGES
from k8s.efa_device_plugin import EfaDevicePluginChart
from tests.k8s.efa_chart import FIXTURE

CHART = json.loads(FIXTURE.read_text())


def _pod() -> dict:
    image = IMAGES["efa-device-plugin"]
    (ds,) = EfaDevicePluginChart(cdk8s.App(), "efa", image=f"{image.source}:{image.tag}"
                                 ).to_json()
    return ds["spec"]["template"]["spec"]


def _host_paths(volumes: list[dict], mounts: list[dict]) -> dict:
    """mount path -> (host path, type), whatever the volumes are called."""
    by_name = {v["name"]: v["hostPath"] for v in volumes}
    return {m["mountPath"]: (by_name[m["name"]]["path"], by_name[m["name"]].get("type"))
            for m in mounts}


def test_the_pinned_image_is_the_recorded_charts_app():
    assert IMAGES["efa-device-plugin"].tag == CHART["appVersion"]
    assert CHART["container"]["image"].rsplit(":", 1) == [
        IMAGES["efa-device-plugin"].source, CHART["appVersion"]]


def test_the_plugin_has_the_charts_privileges_host_paths_and_priority():
    pod, chart = _pod(), CHART["pod"]
    (container,) = pod["containers"]
    assert container["securityContext"] == CHART["container"]["securityContext"]
    assert "securityContext" not in pod or pod["securityContext"] == chart.get("securityContext")
    assert _host_paths(pod["volumes"], container["volumeMounts"]) == _host_paths(
        chart["volumes"], CHART["container"]["volumeMounts"])
    for key in ("hostNetwork", "priorityClassName", "automountServiceAccountToken"):
        assert pod[key] == chart[key], key
    assert all(t in pod["tolerations"] for t in chart["tolerations"])
    assert container["resources"]["requests"] == CHART["container"]["resources"]["requests"]
