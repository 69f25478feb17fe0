#!/usr/bin/env python3
"""CDK entry point: context -> validated config -> stacks.

Config is validated before jsii starts, so bad input is one line on stderr and exit code 2.
"""
from config.context import cli_context, load_or_exit

context = cli_context()
cfg = load_or_exit(context)

import aws_cdk as cdk  # noqa: E402  (after validation on purpose)

from stacks.app_builder import build  # noqa: E402

app = cdk.App(context=context)  # feature flags from cdk.json even without the CLI
build(app, cfg)
app.synth()
