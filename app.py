#!/usr/bin/env python3
"""CDK entry point: context -> validated config and endpoint files -> stacks.

Everything is validated before jsii starts, so bad input is one line on stderr and exit 2.
"""
from config.context import ROOT, cli_context, exit_on_config_error
from config.environment import resolve_environment
from k8s.serving import load_endpoints

with exit_on_config_error():
    context = cli_context()
    cfg = resolve_environment(context)
    endpoints = load_endpoints(cfg, ROOT)

import aws_cdk as cdk  # noqa: E402  (after validation on purpose)

from stacks.app_builder import build, write_manifests  # noqa: E402

app = cdk.App(context=context)  # feature flags from cdk.json even without the CLI
stacks = build(app, cfg, endpoints)
app.synth()
write_manifests(cfg, endpoints, ROOT / "dist" / cfg.name)
