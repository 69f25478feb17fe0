"""Operator tools around a deploy: `python -m tools <command> --help` for each.

  upload-model   copy a model (a local directory, ModelScope or Hugging Face) to the model bucket
  mirror         copy the pinned images (and charts) into the environment's ECR, build the router;
                 or carry them as files: --export DIR abroad, --import DIR in China
  router-lock    re-resolve the router image's pinned wheels and Debian packages (maintainers)
  preflight      check an account and region before `cdk deploy`
  prices         write the environment's own prices (AWS Price List Query API) into its file
  smoke          send one request through an endpoint's router and say what is wrong
  fill           fill the GitOps YAML's placeholders (dist/<env>/) from the stacks' outputs
  bench          measure TTFT, throughput, cache hits and cost of an OpenAI-compatible endpoint
  bench-compare  put two `bench` runs side by side
  calibrate      measure a vLLM worker and write an emulator profile (bench-routing --profile-file)
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from bench import benchmark, calibrate
from config.arguments import OneLineParser
from tools import fill, mirror, preflight, prices, router_image, smoke, upload_model
from tools.cli import run_command


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m tools", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (upload_model, mirror, preflight, prices, router_image, smoke, fill,
                   benchmark, calibrate):
        module.register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
