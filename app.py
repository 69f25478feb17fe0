#!/usr/bin/env python3
"""CDK entry point: context -> validated config and endpoint files -> stacks.

Everything is validated before jsii starts, so bad input is one line on stderr and exit 2.
Synth makes no lookups (an existing VPC is described in its environment file): no credentials.
"""
import sys
from pathlib import Path

from config.context import ROOT, cli_context, exit_on_config_error
from config.environment import resolve_environment
from k8s.serving import load_endpoints

with exit_on_config_error():
    context = cli_context()
    cfg = resolve_environment(context)
    endpoints = load_endpoints(cfg, ROOT)

import aws_cdk as cdk  # noqa: E402  (after validation on purpose)

app = cdk.App(context=context)  # feature flags from cdk.json even without the CLI

from stacks.app_builder import (  # noqa: E402
    SUMMARY_FILE, build, warning_summary, write_manifests,
)
from stacks.plan import PLAN_FILE, plan_text  # noqa: E402

stacks = build(app, cfg, endpoints)
app.synth()
write_manifests(cfg, endpoints, ROOT / "dist" / cfg.name)
# The CLI prints CDK's warnings after the app exits: this line comes first there, and `make
# synth` repeats it from the assembly after them (SUMMARY_FILE), so it ends the output.
summary = warning_summary(cfg, stacks.notices)
print(summary, file=sys.stderr)
(Path(app.outdir) / SUMMARY_FILE).write_text(summary + "\n")
# What will run and what it costs an hour: `make synth` ends with it (stacks/plan.py).
(Path(app.outdir) / PLAN_FILE).write_text(plan_text(cfg, endpoints) + "\n")
