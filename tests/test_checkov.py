"""checkov (pinned in requirements-checkov.txt, its own venv) over every synthesized template of
every declared environment and every manifest we render (serving, monitoring, device plugin):
no failed check outside security/checkov-skips.yaml, and no entry there that matches nothing.
One checkov run covers both frameworks and every environment; each environment's files are
judged on their own.
"""
from __future__ import annotations

import fnmatch
import json
import os
from pathlib import Path

import cdk8s
import pytest
import yaml

from k8s.device_plugin import DevicePluginChart
from k8s.efa_device_plugin import EfaDevicePluginChart
from k8s.monitoring import build_monitoring_charts
from k8s.serving import build_charts, load_endpoints, placeholder_facts
from tests.background import Background
from tests.conftest import ENVIRONMENTS, ROOT, YAML_DUMPER, narrowed
from bench.pd_render import rendered

# The HyperPod docs' DPD example, rendered disaggregated (tests/k8s/test_pd.py): global on p5,
# China on p4d.24xlarge (cn-northwest-1)
PD_RENDERS = {"pd-global": ("dev", "p5.48xlarge"), "pd-china": ("china", "p4d.24xlarge")}

CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"
SKIPS = yaml.safe_load((ROOT / "security" / "checkov-skips.yaml").read_text())


FRAMEWORKS = ("cloudformation", "kubernetes")
# The tests that read the disaggregated renders' results (the skip file's check reads every
# failed check): a session that selects neither renders and scans no disaggregated endpoint.
_READ_PD = {"test_disaggregated_endpoints_fail_no_check_outside_the_reasoned_skips",
            "test_every_skip_still_earns_its_place"}


def start_scan(synths, files: Path, with_pd: bool) -> Background:
    """Every declared environment's templates and manifests (and, `with_pd`, the disaggregated
    renders) written to `files`, and one checkov process started over them: both frameworks
    (its imports, ~3 s of CPU, once); each runner takes only its own files (templates hold no
    `kind`, manifests no `Resources`). --skip-download: no call to Bridgecrew's API for
    guideline links (the same checks run). tests/conftest.py starts it as soon as the last
    environment is synthesized, so it runs on the other core while the suite goes on."""
    for name, synth in synths.all().items():
        for stack, template in synth.templates.items():
            (files / f"{name}--{stack}.template.json").write_text(json.dumps(template))
        cfg = synth.cfg
        specs = load_endpoints(cfg, ROOT)
        charts = [*build_charts(cdk8s.App(), cfg, specs, placeholder_facts(cfg, specs)),
                  *build_monitoring_charts(cdk8s.App(), cfg, specs).all(),
                  DevicePluginChart(cdk8s.App(), "nvidia-device-plugin",
                                    image=cfg.images.uri("nvidia-device-plugin"))]
        (files / f"{name}--manifests.yaml").write_text(
            _dump_all([d for c in charts for d in c.to_json()]))
    if with_pd:
        for name, (env, instance_type) in PD_RENDERS.items():   # disaggregated endpoints
            pd = rendered(env, instance_type)
            efa = EfaDevicePluginChart(cdk8s.App(), "efa-device-plugin",
                                       image=pd.cfg.images.uri("efa-device-plugin"))
            (files / f"{name}--manifests.yaml").write_text(_dump_all([*pd.docs, *efa.to_json()]))
    # In one process (CHECKOV_PARALLELIZATION_TYPE=none): its default forks a worker per
    # runner and file group, ~40% more CPU for the same results on a machine whose cores the
    # suite's two workers already fill
    return Background([str(CHECKOV), "-d", str(files), "--framework", *FRAMEWORKS,
                       "-o", "json", "--compact", "--skip-download"], timeout=600,
                      env={**os.environ, "CHECKOV_PARALLELIZATION_TYPE": "none"})


def reads_pd(items) -> bool:
    """Whether the session's selected tests read the disaggregated renders' results."""
    return bool(_READ_PD & {item.originalname for item in items})


def _dump_all(docs: list[dict]) -> str:
    """YAML for checkov to read."""
    return yaml.dump_all(docs, Dumper=YAML_DUMPER)


@pytest.fixture(scope="module")
def scans(synths, tmp_path_factory, request) -> dict[str, dict]:
    """One checkov run over every template and manifest, by framework."""
    assert CHECKOV.exists(), "run `make test` (it creates .venv-checkov)"
    synths.all()   # the last environment's synth starts the scan (tests/conftest.py)
    run = synths.checkov or start_scan(synths, tmp_path_factory.mktemp("checkov"),
                                       reads_pd(request.session.items))
    proc = run.result()
    assert proc.returncode in (0, 1), proc.stderr[-2000:]   # 1: some check failed
    reports = json.loads(proc.stdout)
    reports = {r["check_type"]: r for r in (reports if isinstance(reports, list) else [reports])}
    assert sorted(reports) == sorted(FRAMEWORKS), sorted(reports)
    assert all(r["summary"]["parsing_errors"] == 0 for r in reports.values())
    return reports


def _reasoned(framework: str, check: dict) -> bool:
    entry = SKIPS[framework].get(check["check_id"])
    return bool(entry) and any(fnmatch.fnmatchcase(check["resource"], p)
                               for p in entry["resources"])


def _of(name: str, checks: list[dict]) -> list[dict]:
    return [c for c in checks if Path(c["file_path"]).name.startswith(f"{name}--")]


@pytest.mark.parametrize("name", ENVIRONMENTS)
@pytest.mark.parametrize("framework", FRAMEWORKS)
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


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_skip_still_earns_its_place(scans, framework):
    if narrowed():
        pytest.skip("--environment left environments out: a skip may fail only there")
    used = {c["check_id"] for c in scans[framework]["results"]["failed_checks"]}
    for check_id, entry in SKIPS[framework].items():
        assert check_id in used, f"{check_id} no longer fails: remove it from the skip file"
        assert len(entry["reason"]) > 20 and entry["resources"]
