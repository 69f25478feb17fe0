"""The field table covers HyperPod's whole CRD, chart 2.2.2's and today's (v3.7: README.md beside
the data), and docs/serving.md shows exactly that table."""
from __future__ import annotations

import re

from config.hyperpod_fields import FIELDS, IGNORED, USED, field_for, markdown_table
from tests.conftest import ROOT

import pytest

DATA = ROOT / "tests" / "fixtures" / "hyperpod"
CRDS = {"2.2.2": DATA / "FIELDS.txt", "2.7.0": DATA / "FIELDS-2.7.0.txt"}


def _crd_v1_paths(chart: str = "2.7.0") -> list[str]:
    text = CRDS[chart].read_text()
    v1 = text.split("## version v1\n", 1)[1].split("## version v1alpha1", 1)[0]
    return [line.split(":", 1)[0] for line in v1.splitlines()
            if line.startswith("spec.")]


def test_todays_crd_holds_the_older_one_and_the_fields_of_v3_3_to_v3_7():
    old, new = set(_crd_v1_paths("2.2.2")), set(_crd_v1_paths("2.7.0"))
    assert old < new
    assert {"spec.tolerations", "spec.lmcache.mode", "spec.kubernetes.podTemplateAnnotations",
            "spec.inferenceGateway", "spec.modelCacheConfig.weightsCache.nodeAffinity",
            "spec.loadBalancer.idleTimeoutSeconds"} <= new - old


@pytest.mark.parametrize("chart", sorted(CRDS))
def test_every_crd_field_is_in_a_row(chart):
    paths = _crd_v1_paths(chart)
    assert len(paths) > 900            # the flattened v1 CRD, not a stub
    uncovered = [p for p in paths if field_for(p) is None and p not in (
        # containers of rows, not fields of their own
        "spec.modelSourceConfig", "spec.kvCacheSpec", "spec.kvCacheSpec.l2CacheSpec",
        "spec.intelligentRoutingSpec", "spec.inferenceGateway", "spec.metrics",
        "spec.metrics.modelMetrics",
        "spec.loadBalancer", "spec.tlsConfig", "spec.tlsConfig.customCertificateConfig",
        "spec.worker", "spec.worker.resources", "spec.worker.modelInvocationPort",
        "spec.worker.modelVolumeMount", "spec.kubernetes")]
    assert uncovered == []


def test_every_row_names_a_field_of_the_crd_or_says_it_is_ours():
    crd = set(_crd_v1_paths())
    ours = {"apiVersion", "kind", "metadata.name", "metadata.namespace", "metadata.labels",
            "metadata.annotations", "spec.kvCacheSpec.l1CacheSizeGiB",
            "spec.kvCacheSpec.forceL2Cache", "spec.kvCacheSpec.prefixTokens",
            "spec.kvCacheSpec.modelShape", "spec.kvCacheSpec.workingSetTokens",
                "spec.pdSpec.forceDisaggregation",
            # operator v3.7 (aws/sagemaker-hyperpod-cli #464): not in the 2.2.2 CRD read here
            "spec.lmcache", "spec.kvCacheSpec.lmcache"}
    for path in FIELDS:
        assert path in crd or path in ours, path
    assert {f.handling for f in FIELDS.values()} == {USED, IGNORED}


def test_docs_show_the_table():
    doc = (ROOT / "docs" / "serving.md").read_text()
    block = re.search(r"<!-- fields:begin[^>]*-->\n(.*?)\n<!-- fields:end -->", doc, re.S)
    assert block and block.group(1) == markdown_table()
