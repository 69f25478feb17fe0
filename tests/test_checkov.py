"""checkov (pinned in requirements-checkov.txt, its own venv) over every synthesized template of
every declared environment and every manifest we render (serving, monitoring, device plugin):
no failed check outside security/checkov-skips.yaml, and no entry there that matches nothing.
One checkov run per framework covers every environment; each environment's files are judged
on their own.
"""
from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import cdk8s
import pytest
import yaml

from k8s.device_plugin import DevicePluginChart
from k8s.efa_device_plugin import EfaDevicePluginChart
from k8s.monitoring import build_monitoring_charts
from k8s.serving import build_charts, load_endpoints, placeholder_facts
from tests.background import Background
from tests.conftest import ENVIRONMENTS, ROOT, narrowed
from bench.pd_render import rendered

# The HyperPod docs' DPD example, rendered disaggregated (tests/k8s/test_pd.py): global on p5,
# China on p4d.24xlarge (cn-northwest-1)
PD_RENDERS = {"pd-global": ("dev", "p5.48xlarge"), "pd-china": ("china", "p4d.24xlarge")}

CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"
SKIPS = yaml.safe_load((ROOT / "security" / "checkov-skips.yaml").read_text())


def _start_checkov(directory: Path, framework: str) -> Background:
    # --skip-download: no call to Bridgecrew's API for guideline links (the same checks run)
    return Background([str(CHECKOV), "-d", str(directory), "--framework", framework,
                       "-o", "json", "--compact", "--skip-download"], timeout=600)


def _report(run: Background) -> dict:
    proc = run.result()
    assert proc.returncode in (0, 1), proc.stderr[-2000:]   # 1: some check failed
    report = json.loads(proc.stdout)
    (report,) = report if isinstance(report, list) else [report]
    assert report["summary"]["parsing_errors"] == 0
    return report


@pytest.fixture(scope="module")
def scans(synths, tmp_path_factory) -> dict[str, dict]:
    """One checkov run per framework, the CloudFormation one started as soon as its files are
    written, so that it runs while the manifests are rendered and beside the Kubernetes one."""
    assert CHECKOV.exists(), "run `make test` (it creates .venv-checkov)"
    cfn, k8s = tmp_path_factory.mktemp("cfn"), tmp_path_factory.mktemp("k8s")
    running: dict[str, Background] = {}
    try:
        for name, synth in synths.all().items():
            for stack, template in synth.templates.items():
                (cfn / f"{name}--{stack}.template.json").write_text(json.dumps(template))
        running["cloudformation"] = _start_checkov(cfn, "cloudformation")
        for name, synth in synths.all().items():
            cfg = synth.cfg
            specs = load_endpoints(cfg, ROOT)
            charts = [*build_charts(cdk8s.App(), cfg, specs, placeholder_facts(cfg, specs)),
                      *build_monitoring_charts(cdk8s.App(), cfg, specs).all(),
                      DevicePluginChart(cdk8s.App(), "nvidia-device-plugin",
                                        image=cfg.images.uri("nvidia-device-plugin"))]
            (k8s / f"{name}--manifests.yaml").write_text(
                yaml.safe_dump_all([d for c in charts for d in c.to_json()]))
        for name, (env, instance_type) in PD_RENDERS.items():   # disaggregated endpoints
            pd = rendered(env, instance_type)
            efa = EfaDevicePluginChart(cdk8s.App(), "efa-device-plugin",
                                       image=pd.cfg.images.uri("efa-device-plugin"))
            (k8s / f"{name}--manifests.yaml").write_text(
                yaml.safe_dump_all([*pd.docs, *efa.to_json()]))
        running["kubernetes"] = _start_checkov(k8s, "kubernetes")
        return {framework: _report(proc) for framework, proc in running.items()}
    finally:
        for run in running.values():
            run.stop()


def _reasoned(framework: str, check: dict) -> bool:
    entry = SKIPS[framework].get(check["check_id"])
    return bool(entry) and any(fnmatch.fnmatchcase(check["resource"], p)
                               for p in entry["resources"])


def _of(name: str, checks: list[dict]) -> list[dict]:
    return [c for c in checks if Path(c["file_path"]).name.startswith(f"{name}--")]


@pytest.mark.parametrize("name", ENVIRONMENTS)
@pytest.mark.parametrize("framework", ["cloudformation", "kubernetes"])
def test_no_failed_check_outside_the_reasoned_skips(scans, framework, name):
    report = scans[framework]
    failed = _of(name, report["results"]["failed_checks"])
    unreasoned = sorted({(c["check_id"], c["resource"]) for c in failed
                         if not _reasoned(framework, c)})
    assert not unreasoned, unreasoned
    passed = _of(name, report["results"]["passed_checks"])
    assert len(passed) > 50   # it really checked this environment's files
    print(f"checkov {framework} {name}: {len(passed)} passed, {len(failed)} failed "
          f"(all in the skip file)")


@pytest.mark.parametrize("name", sorted(PD_RENDERS))
def test_disaggregated_endpoints_fail_no_check_outside_the_reasoned_skips(scans, name):
    report = scans["kubernetes"]
    failed = _of(name, report["results"]["failed_checks"])
    assert not sorted({(c["check_id"], c["resource"]) for c in failed
                       if not _reasoned("kubernetes", c)})
    assert len(_of(name, report["results"]["passed_checks"])) > 50


@pytest.mark.parametrize("framework", ["cloudformation", "kubernetes"])
def test_every_skip_still_earns_its_place(scans, framework):
    if narrowed():
        pytest.skip("--environment left environments out: a skip may fail only there")
    used = {c["check_id"] for c in scans[framework]["results"]["failed_checks"]}
    for check_id, entry in SKIPS[framework].items():
        assert check_id in used, f"{check_id} no longer fails: remove it from the skip file"
        assert len(entry["reason"]) > 20 and entry["resources"]
