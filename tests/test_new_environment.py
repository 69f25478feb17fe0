"""A team's own environment gets every gate with no edit to tests/.

In a scratch copy of the repository, a new environment is added as README.md says (its own
file, account, region and VPC range), and the suite runs there narrowed to it (`-k prod-cn
--environment prod-cn`: the gates' parameters come from the copy's declarations). Each gate must
have run on it and passed; its snapshots are recorded (`--snapshot-update`, as a team records
them once with its environment). That run starts with the session, beside the rest of it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.background import Background
from tests.conftest import ROOT

NAME = "prod-cn"
ENVIRONMENT = {   # cn-north-1 (no p4d there), two zones, a /18 of 172.16/12, two endpoints' worth
    "account": "333333333333",
    "region": "cn-north-1",
    "availabilityZones": ["cn-north-1a", "cn-north-1b"],
    "vpcCidr": "172.24.0.0/18",
    "kubernetesVersion": "1.35",
    "natGateways": 2,
    "clusterEndpoint": {"public": False},
    "adminRoleNames": ["MlPlatformAdmin"],
    "nodeGroups": {
        "system": {"instanceTypes": ["m6i.xlarge"], "minSize": 3, "maxSize": 5},
        "gpu": [{"name": "g5", "instanceTypes": ["g5.24xlarge"], "minSize": 1, "maxSize": 3,
                 "diskSizeGiB": 300}],
    },
    "cache": {"kind": "elasticache", "nodeType": "cache.r7g.large", "replicas": 1},
    "endpoints": ["endpoints/llama-8b-intel-routing.yaml"],
    "instanceTypeMap": {"ml.g5.8xlarge": "g5.24xlarge"},
    "tags": {"team": "ml-platform"},
    "alerts": {"subscriptions": [{"protocol": "email", "endpoint": "oncall@example.cn"}]},
}
# Every per-environment gate, by test: each must have run on the new environment and passed.
GATES = {
    "tests/stacks/test_gates.py": ["test_cdk_nag_and_cdk_validation_report_no_unacknowledged_"
                                   "findings", "test_cfn_lint_has_no_errors_or_warnings"],
    "tests/test_checkov.py": ["test_no_failed_check_outside_the_reasoned_skips"],
    "tests/stacks/test_scheduling.py": ["test_every_pod_of_the_shipped_environments_fits_a_"
                                        "node_group", "test_config_groups_match_the_templates"],
    "tests/stacks/test_deploy_order.py": ["test_every_in_cluster_object_waits_for_what_it_"
                                          "needs"],
    "tests/k8s/test_worker_gates.py": ["test_shipped_workers_reach_vllm_in_their_images_layout",
                                       "test_shipped_workers_fit_their_memory"],
    "tests/k8s/test_delivery.py": ["test_dist_yaml_is_written_valid_and_token_free"],
    "tests/k8s/test_monitoring.py": ["test_every_manifest_is_valid_at_the_cluster_version"],
    "tests/k8s/test_lmcache_config.py": ["test_every_environments_workers_config_is_read_by_"
                                         "their_lmcache"],
    "tests/stacks/test_snapshots.py": ["test_template_snapshot"],
    "tests/stacks/test_stacks.py": ["test_network", "test_load_balancer_subnets_hold_no_pod",
                                    "test_cluster"],
    "tests/observability/test_alert_routing.py": ["test_every_alert_reaches_the_receiver_of_"
                                                  "its_severity"],
}
_SHARED = (".venv", "node_modules", ".venv-lmcache", ".lmcache-parsers", ".venv-checkov")


def _scratch_copy(dest):
    """The repository as a clone has it (tracked and untracked, not ignored), with the
    installed toolchains linked."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], cwd=ROOT, capture_output=True, check=True,
                           timeout=60).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file() and not src.is_symlink() and not rel.startswith(_SHARED):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    for name in _SHARED:
        (dest / name).symlink_to((ROOT / name).resolve())


def _gates_run(tmp: Path) -> Background:
    """The suite in a scratch copy with the new environment, narrowed to it (a subprocess
    that starts with the session: tests/background.py)."""
    repo = tmp / "repo"
    _scratch_copy(repo)
    (repo / "environments" / f"{NAME}.json").write_text(json.dumps(ENVIRONMENT, indent=2))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CDK_"))}
    env["PATH"] = f"{repo / '.venv' / 'bin'}:{repo / 'node_modules' / '.bin'}:{env['PATH']}"
    return Background(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--environment", NAME,
         "-k", NAME, "--snapshot-update", f"--junitxml={tmp / 'junit.xml'}", *sorted(GATES)],
        cwd=repo, env=env, timeout=900)


@pytest.mark.starts_early(start=_gates_run)
def test_a_new_environment_runs_every_gate_without_touching_tests(early):
    repo, report = early.tmp / "repo", early.tmp / "junit.xml"
    proc = early.run.result()
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    ran: dict[tuple[str, str], list[str]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        outcome = ("failed" if case.find("failure") is not None or case.find("error") is not None
                   else "skipped" if case.find("skipped") is not None else "passed")
        module = case.get("classname", "").replace(".", "/") + ".py"
        ran.setdefault((module, case.get("name", "").split("[")[0]), []).append(outcome)
        assert NAME in case.get("name", ""), case.get("name")   # only the new environment
    for module, tests in GATES.items():
        for test in tests:
            outcomes = ran.get((module, test))
            # passed (a China environment has no Observability stack to snapshot: skipped)
            assert outcomes and "passed" in outcomes and "failed" not in outcomes, (
                module, test, outcomes)
    # its snapshots were recorded beside the samples', with its own VPC range in them
    snapshots = (repo / "tests/stacks/__snapshots__/test_snapshots.ambr").read_text()
    assert f"test_template_snapshot[{NAME}-Network]" in snapshots
    assert '"CidrBlock": "172.24.0.0/18"' in snapshots
