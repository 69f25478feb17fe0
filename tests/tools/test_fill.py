"""`python -m tools fill`: the GitOps YAML's placeholders filled from the stacks' outputs
(CloudFormation answered in-process), runtime variables left alone, nothing written on any
failure."""
from __future__ import annotations

import datetime

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.validate import validate_parameters

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


def _deploy(monkeypatch: pytest.MonkeyPatch, stacks: set[str]) -> None:
    """CloudFormation with `stacks` deployed, holding the outputs the placeholders name:
    DescribeStacks answers them (its answer checked against the API's output shape, as a
    Stubber checks it) and, for any other stack, the ValidationError CloudFormation gives.
    Answered by a botocore handler, in any order: moto's CloudFormation costs ~2 CPU-s to
    import for these two calls. Any other call fails the test rather than leave the process."""
    real = boto3.Session.client

    def stack_name(params, context, **_):
        context["stack"] = params["StackName"]

    def describe(model, context, **_):
        name = context["stack"]
        stack = name.removeprefix("KvCache-dev-")
        if stack not in stacks or stack == name:
            return AWSResponse(None, 400, {}, None), {"Error": {
                "Code": "ValidationError", "Message": f"Stack with id {name} does not exist"}}
        answer = {"Stacks": [{
            "StackName": name, "CreationTime": datetime.datetime(2026, 1, 1),
            "StackStatus": "CREATE_COMPLETE", "Outputs": [
                {"OutputKey": p.output, "OutputValue": OUTPUTS[p.name]}
                for p in PLACEHOLDERS.values() if p.stack == stack]}]}
        validate_parameters(answer, model.output_shape)
        return AWSResponse(None, 200, {}, None), answer

    def unanswered(request, **_):
        raise AssertionError(f"fill sent {request.method} {request.url}: only DescribeStacks "
                             "is answered here")

    def client(self, service, *args, **kwargs):
        c = real(self, service, *args, **kwargs)
        assert service == "cloudformation", service
        c.meta.events.register("before-parameter-build.cloudformation.DescribeStacks",
                               stack_name)
        c.meta.events.register("before-call.cloudformation.DescribeStacks", describe)
        c.meta.events.register("before-send", unanswered)
        return c

    monkeypatch.setattr(boto3.Session, "client", client)


def test_every_placeholder_is_filled_and_runtime_variables_survive(dist, tmp_path, aws_env,
                                                                   monkeypatch):
    texts = {p.name: p.read_text() for p in dist.rglob("*.yaml")}
    named = {m for t in texts.values() for m in PATTERN.findall(t)}
    assert {"MODEL_BUCKET", "API_KEY_SECRET_ARN", "LB_SUBNETS",
            "AMP_QUERY_URL", "AMP_REMOTE_WRITE_URL"} <= named
    runtime = {t.count("${") for t in texts.values()}
    assert max(runtime) > 0   # the router front's ${FRONT_BIND}, the init containers' shell
    _deploy(monkeypatch, {PLACEHOLDERS[n].stack for n in named})
    assert main(["fill", "--env", "dev", "--dist", str(dist), "--out",
                 str(tmp_path / "out")]) == 0
    for rel in (p.relative_to(dist) for p in dist.rglob("*.yaml")):
        before, after = (dist / rel).read_text(), (tmp_path / "out" / rel).read_text()
        assert "@@KVCACHE_" not in after
        assert after.count("${") == before.count("${"), rel
        assert after == PATTERN.sub(lambda m: OUTPUTS[m.group(1)], before)


def test_a_stack_not_deployed_is_one_line_and_nothing_is_written(dist, tmp_path, aws_env,
                                                                   capsys, monkeypatch):
    _deploy(monkeypatch, {"Serving", "Storage", "Observability"})   # no Network stack
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
