#!/usr/bin/env python3
"""CDK entry point: context -> validated config and endpoint files -> stacks.

Everything is validated before jsii starts, so bad input is one line on stderr and exit 2.
An existing VPC not yet in CDK's lookup cache is the one exception: run by the CDK CLI, the app
only asks for the lookup, and the CLI runs it again with the answer (stacks/lookups.py).
"""
import os
import sys
from pathlib import Path

from config.context import ROOT, cli_context, exit_on_config_error
from config.environment import resolve_environment
from config.network import VpcLookupNeeded
from k8s.serving import load_endpoints

lookup = None
with exit_on_config_error():
    context = cli_context()
    try:
        cfg = resolve_environment(context)
    except VpcLookupNeeded as need:
        if not os.environ.get("CDK_CLI_VERSION"):   # no CLI to perform it: the error line
            raise
        lookup = need
    else:
        endpoints = load_endpoints(cfg, ROOT)

import aws_cdk as cdk  # noqa: E402  (after validation on purpose)

app = cdk.App(context=context)  # feature flags from cdk.json even without the CLI
if lookup is not None:
    from stacks.lookups import request_vpc_lookup

    request_vpc_lookup(app, lookup)
    app.synth()
    print(f"note: environment {lookup.environment}: looking up {lookup.vpc_id} in account "
          f"{lookup.account} ({lookup.region}); commit cdk.context.json", file=sys.stderr)
    sys.exit(0)

from stacks.app_builder import (  # noqa: E402
    SUMMARY_FILE, build, warning_summary, write_manifests,
)

stacks = build(app, cfg, endpoints)
app.synth()
write_manifests(cfg, endpoints, ROOT / "dist" / cfg.name)
# The CLI prints CDK's warnings after the app exits: this line comes first there, and `make
# synth` repeats it from the assembly after them (SUMMARY_FILE), so it ends the output.
summary = warning_summary(cfg, stacks.notices)
print(summary, file=sys.stderr)
(Path(app.outdir) / SUMMARY_FILE).write_text(summary + "\n")
