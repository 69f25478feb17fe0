"""Fill the GitOps YAML's placeholders (`@@KVCACHE_NAME@@`) with the deployed stacks' outputs.

    python -m tools fill --env dev --out ../gitops/kvcache/dev

Reads every file `cdk synth` wrote to `dist/<env>/` (or `--dist`), asks CloudFormation once per
stack for the outputs the placeholders name (k8s/placeholders.py says which), and writes the
filled copies under `--out` with the same relative paths. Only placeholders are replaced: the
`${...}` variables the manifests use at run time stay as they are (bare `envsubst` would blank
them). Nothing is written unless every placeholder could be filled.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from config.arguments import ToolError, add_command, check_output_dir, err_console, \
    load_environment
from config.context import ROOT
from k8s.placeholders import PATTERN, PLACEHOLDERS
from tools.cli import Aws


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "fill", main, "fill the GitOps YAML's placeholders from the stacks' "
                    "outputs", __doc__)
    p.add_argument("--dist", type=Path, help="the folder cdk synth wrote (default dist/<env>)")
    p.add_argument("--out", type=Path, required=True,
                   help="folder for the filled copies (not the --dist folder)")


def placeholders_in(files: dict[Path, str]) -> set[str]:
    """Every placeholder the files name; one we do not know is bad input."""
    found = {m for text in files.values() for m in PATTERN.findall(text)}
    unknown = sorted(found - set(PLACEHOLDERS))
    if unknown:
        raise ToolError.bad_input("placeholder", f"@@KVCACHE_{unknown[0]}@@",
                                  ", ".join(p.token for p in PLACEHOLDERS.values()))
    return found


def fill(files: dict[Path, str], values: dict[str, str]) -> dict[Path, str]:
    return {path: PATTERN.sub(lambda m: values[m.group(1)], text)
            for path, text in files.items()}


def main(args: argparse.Namespace, aws: Aws | None = None) -> int:
    cfg = load_environment(args)
    dist = (args.dist or ROOT / "dist" / cfg.name).resolve()
    if not dist.is_dir():
        raise ToolError.bad_input("--dist", str(dist), f"the folder `cdk synth -c env=...` "
                                  f"wrote for {cfg.name} (run it first)")
    out = args.out.resolve()
    if out.is_relative_to(dist):
        raise ToolError.bad_input("--out", str(args.out), "a folder outside --dist (the "
                                  "placeholders there are what a review compares)")
    check_output_dir("--out", out)
    files = {p.relative_to(dist): p.read_text(encoding="utf-8")
             for p in sorted(dist.rglob("*.yaml")) if p.is_file()}
    if not files:
        raise ToolError.bad_input("--dist", str(dist), "a folder holding the YAML cdk synth "
                                  "writes")
    aws = aws or Aws(cfg, args.profile)
    values = {}
    for name in sorted(placeholders_in(files)):
        p = PLACEHOLDERS[name]
        values[name] = aws.stack_output(p.stack, p.output)
    for rel, text in fill(files, values).items():
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    err_console.print(f"filled {len(values)} placeholders in {len(files)} files: {out}")
    return 0
