"""The field table covers HyperPod's whole CRD, and docs/serving.md shows exactly that table."""
from __future__ import annotations

import re

from config.hyperpod_fields import FIELDS, IGNORED, USED, field_for, markdown_table
from tests.conftest import ROOT

CRD_FIELDS = ROOT / "tests" / "fixtures" / "hyperpod" / "FIELDS.txt"


def _crd_v1_paths() -> list[str]:
    text = CRD_FIELDS.read_text()
    v1 = text.split("## version v1\n", 1)[1].split("## version v1alpha1", 1)[0]
    return [line.split(":", 1)[0] for line in v1.splitlines()
            if line.startswith("spec.")]


def test_every_crd_field_is_in_a_row():
    paths = _crd_v1_paths()
    assert len(paths) > 900            # the flattened v1 CRD, not a stub
    uncovered = [p for p in paths if field_for(p) is None and p not in (
        # containers of rows, not fields of their own
        "spec.modelSourceConfig", "spec.kvCacheSpec", "spec.kvCacheSpec.l2CacheSpec",
        "spec.intelligentRoutingSpec", "spec.metrics", "spec.metrics.modelMetrics",
        "spec.loadBalancer", "spec.tlsConfig", "spec.tlsConfig.customCertificateConfig",
        "spec.worker", "spec.worker.resources", "spec.worker.modelInvocationPort",
        "spec.worker.modelVolumeMount")]
    assert uncovered == []


def test_every_row_names_a_field_of_the_crd_or_says_it_is_ours():
    crd = set(_crd_v1_paths())
    ours = {"apiVersion", "kind", "metadata.name", "metadata.namespace", "metadata.labels",
            "metadata.annotations", "spec.kvCacheSpec.l1CacheSizeGiB",
            "spec.kvCacheSpec.forceL2Cache", "spec.kvCacheSpec.prefixTokens",
            "spec.kvCacheSpec.modelShape", "spec.kvCacheSpec.workingSetTokens",
            # operator v3.7 (aws/sagemaker-hyperpod-cli #464): not in the 2.2.2 CRD read here
            "spec.lmcache", "spec.kvCacheSpec.lmcache"}
    for path in FIELDS:
        assert path in crd or path in ours, path
    assert {f.handling for f in FIELDS.values()} == {USED, IGNORED}


def test_docs_show_the_table():
    doc = (ROOT / "docs" / "serving.md").read_text()
    block = re.search(r"<!-- fields:begin[^>]*-->\n(.*?)\n<!-- fields:end -->", doc, re.S)
    assert block and block.group(1) == markdown_table()
