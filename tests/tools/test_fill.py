"""`python -m tools fill`: the GitOps YAML's placeholders filled from the stacks' outputs (moto's
CloudFormation), runtime variables left alone, nothing written on any failure."""
from __future__ import annotations

import json

import boto3
import pytest
from moto import mock_aws

from k8s.placeholders import PATTERN, PLACEHOLDERS
from k8s.serving import load_endpoints
from stacks.app_builder import write_manifests
from tests.conftest import ROOT, context_for
from config import resolve_environment
from tools.__main__ import main

OUTPUTS = {p.name: f"value-of-{p.output}" for p in PLACEHOLDERS.values()}


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    cfg = resolve_environment(context_for(env="dev"))
    out = tmp_path_factory.mktemp("dist") / "dev"
    write_manifests(cfg, load_endpoints(cfg, ROOT), out)
    return out


def _deploy(stacks: set[str]) -> None:
    """Stacks holding the outputs the placeholders name (a template moto accepts)."""
    cfn = boto3.client("cloudformation", region_name="us-west-2")
    for stack in stacks:
        outputs = {p.output: {"Value": OUTPUTS[p.name]} for p in PLACEHOLDERS.values()
                   if p.stack == stack}
        cfn.create_stack(StackName=f"KvCache-dev-{stack}", TemplateBody=json.dumps({
            "Resources": {"T": {"Type": "AWS::SNS::Topic"}},
            "Outputs": outputs}))


def test_every_placeholder_is_filled_and_runtime_variables_survive(dist, tmp_path, aws_env):
    texts = {p.name: p.read_text() for p in dist.rglob("*.yaml")}
    named = {m for t in texts.values() for m in PATTERN.findall(t)}
    assert {"MODEL_BUCKET", "API_KEY_SECRET_ARN", "LB_SUBNETS",
            "AMP_QUERY_URL", "AMP_REMOTE_WRITE_URL"} <= named
    runtime = {t.count("${") for t in texts.values()}
    assert max(runtime) > 0   # the router front's ${FRONT_BIND}, the init containers' shell
    with mock_aws():
        _deploy({PLACEHOLDERS[n].stack for n in named})
        assert main(["fill", "--env", "dev", "--dist", str(dist), "--out",
                     str(tmp_path / "out")]) == 0
    for rel in (p.relative_to(dist) for p in dist.rglob("*.yaml")):
        before, after = (dist / rel).read_text(), (tmp_path / "out" / rel).read_text()
        assert "@@KVCACHE_" not in after
        assert after.count("${") == before.count("${"), rel
        assert after == PATTERN.sub(lambda m: OUTPUTS[m.group(1)], before)


def test_a_stack_not_deployed_is_one_line_and_nothing_is_written(dist, tmp_path, aws_env,
                                                                   capsys):
    with mock_aws():
        _deploy({"Serving", "Storage", "Observability"})   # no Network stack
        assert main(["fill", "--env", "dev", "--dist", str(dist), "--out",
                     str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "stack KvCache-dev-Network not found" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", ["inside dist", "unknown placeholder", "no dist"])
def test_bad_input_is_one_line_and_exit_2(dist, tmp_path, aws_env, capsys, case):
    args = ["fill", "--env", "dev", "--dist", str(dist), "--out", str(tmp_path / "out")]
    if case == "inside dist":
        args[-1] = str(dist / "filled")
    elif case == "unknown placeholder":
        copy = tmp_path / "dist"
        copy.mkdir()
        (copy / "x.yaml").write_text("image: @@KVCACHE_ROUTER_IMAG@@\n")
        args[4] = str(copy)
    else:
        args[4] = str(tmp_path / "nowhere")
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: ")
    assert not (tmp_path / "out").exists()
