"""What every `python -m tools` command shares beyond `config.arguments`: the endpoint files
as the synth validates them, AWS clients, and the entry point that turns failures into exit codes.

Environments are picked exactly as the CDK app picks them (`--env NAME [--china]` reads
`cdk.json` through `config.context` and validates it with `config.environment`), so a tool never
disagrees with a synth about account, region, partition or bucket.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from config import ConfigError, EnvironmentConfig
from config.arguments import ToolError
from config.context import ROOT, declared_environments


def load_endpoints(cfg: EnvironmentConfig) -> tuple:
    """The environment's endpoint files, validated as the synth validates them."""
    from k8s.serving import load_endpoints as _load  # cdk8s: imported only when needed

    return _load(cfg, ROOT)


# --------------------------------------------------------------------------- sizes and time

_UNITS = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "KIB": 2**10, "M": 10**6, "MB": 10**6,
          "MIB": 2**20, "G": 10**9, "GB": 10**9, "GIB": 2**30}


def parse_rate(text: str) -> float:
    """`--rate 50MB/s` (MB = 10^6 bytes, MiB = 2^20; KB, GB, KiB, GiB too) in bytes per second."""
    import re

    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMG]?(?:I?B)?)(?:/S)?\s*", text.upper())
    if not m or float(m.group(1)) <= 0 or m.group(2) not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"--rate = {text!r} is not valid; allowed: a positive rate such as 50MB/s, 200KiB/s, "
            "1GB/s")
    return float(m.group(1)) * _UNITS[m.group(2)]


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def transfer_estimate(total: int, rate: float) -> str:
    """`about 1 h 05 min at 50.0 MB/s`: the time `total` bytes take at `rate` bytes/s."""
    seconds = total / rate
    h, rest = divmod(int(round(seconds)), 3600)
    m, s = divmod(rest, 60)
    span = f"{h} h {m:02d} min" if h else (f"{m} min {s:02d} s" if m else f"{s} s")
    return f"about {span} at {rate / 1e6:.1f} MB/s"


# --------------------------------------------------------------------------- AWS


@dataclass
class Aws:
    """Clients for one environment's account and region (the partition follows the region)."""

    cfg: EnvironmentConfig
    profile: str | None = None
    factory: Callable[[str], Any] | None = None  # tests inject stubbed clients here

    def __post_init__(self) -> None:
        self._clients: dict[str, Any] = {}
        self._session = None

    def client(self, service: str, region: str | None = None) -> Any:
        """`service`'s client in the environment's region, or `region` (an API that answers
        in one region of the partition only: the Price List Query API)."""
        key = f"{service}@{region}" if region else service
        if key not in self._clients:
            if self.factory is not None:
                self._clients[key] = self.factory(service)
            else:
                import boto3
                from botocore.config import Config

                if self._session is None:
                    self._session = boto3.Session(profile_name=self.profile,
                                                  region_name=self.cfg.region)
                config = Config(retries={"mode": "standard", "max_attempts": 5},
                                max_pool_connections=32)
                self._clients[key] = self._session.client(service, region_name=region,
                                                          config=config)
        return self._clients[key]

    def stack_output(self, suffix: str, key: str) -> str:
        """An output of `KvCache-<env>-<suffix>`; a clear error when the stack is not there."""
        from botocore.exceptions import ClientError

        name = f"{self.cfg.stack_prefix}-{suffix}"
        try:
            stacks = self.client("cloudformation").describe_stacks(StackName=name)["Stacks"]
        except ClientError as err:
            if error_code(err) == "ValidationError":  # "Stack with id X does not exist"
                raise ToolError(f"stack {name} not found in {self.cfg.region} (account "
                                f"{self.cfg.account}): deploy it first (cdk deploy {name} "
                                f"{deploy_context(self.cfg)})") from None
            raise
        for output in stacks[0].get("Outputs", []):
            if output.get("OutputKey") == key:
                return output["OutputValue"]
        raise ToolError(f"stack {name} has no output {key}: deploy the current version of it")


def deploy_context(cfg: EnvironmentConfig, root: Path = ROOT) -> str:
    """The `-c` flags that make cdk pick `cfg`: its environment file's name (the China variant
    of a global file is that file's), and `china=true` where its region is in AWS China. Read
    from the declared environments and the region, never from the name: `prod-cn.json` is a
    file of its own, not a variant of `prod`."""
    selection = declared_environments(root).get(cfg.name, {"env": cfg.name})
    china = cfg.facts.partition == "aws-cn"
    return f"-c env={selection['env']}" + (" -c china=true" if china else "")


def error_code(err: Exception) -> str:
    return getattr(err, "response", {}).get("Error", {}).get("Code", "")


def describe_aws_error(err: Exception) -> str:
    """A botocore failure as one line."""
    from botocore.exceptions import ClientError, NoCredentialsError, NoRegionError

    if isinstance(err, NoCredentialsError):
        return "no AWS credentials found: set AWS_PROFILE, pass --profile, or export keys"
    if isinstance(err, NoRegionError):
        return "no AWS region: the environment's region should have been used"
    if isinstance(err, ClientError):
        op = getattr(err, "operation_name", "?")
        msg = err.response.get("Error", {}).get("Message", "")
        return f"AWS {op} failed: {error_code(err)}: {msg}"
    first = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {first}"


# --------------------------------------------------------------------------- entry point


def run_command(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Runs one command; every expected failure becomes one line on stderr and an exit code.

    The AWS SDK is only consulted for failures it raised: `bench` runs without it installed."""
    try:
        return int(func(args) or 0)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except ToolError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if type(err).__module__.split(".")[0] != "botocore":
            raise
        from botocore.exceptions import NoCredentialsError

        print(f"error: {describe_aws_error(err)}", file=sys.stderr)
        return 2 if isinstance(err, NoCredentialsError) else 1
