"""What an environment needs CDK to look up before it can be built: an existing VPC.

The CDK CLI runs the app, finds the lookups the assembly reports missing, performs them with
the account's credentials (through the bootstrap's lookup role), stores the answers in
cdk.context.json and runs the app again; config/network.py then reads them from there.
"""
from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2

from config.network import VpcLookupNeeded


def request_vpc_lookup(app: cdk.App, need: VpcLookupNeeded) -> cdk.Stack:
    """A stack that only asks for the VPC (its assembly is never deployed: the CLI runs the
    app again once the answer is cached)."""
    stack = cdk.Stack(app, f"KvCache-{need.environment}-Lookup",
                      env=cdk.Environment(account=need.account, region=need.region))
    ec2.Vpc.from_lookup(stack, "Vpc", vpc_id=need.vpc_id)
    cdk.CfnWaitConditionHandle(stack, "Placeholder")   # a template needs a resource
    return stack
