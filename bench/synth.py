"""Times a full `cdk synth` of each shipped environment and the whole test suite.

Figures, not assertions: run `make bench` and copy the table into the issue note.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
CDK = ROOT / "node_modules" / ".bin" / "cdk"


def _timed(cmd: list[str], env: dict | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    rows = []
    variants = [("dev", []), ("china", []), ("dev (china=true)", ["-c", "china=true"])]
    for label, extra in variants:
        env_name = label.split()[0]
        out = ROOT / "cdk.out.bench" / label.replace(" ", "_")
        rows.append((f"cdk synth {label}", _timed(
            [str(CDK), "synth", "-q", "-c", f"env={env_name}", *extra, "-o", str(out)])))
    rows.append(("pytest (whole suite)", _timed([sys.executable, "-m", "pytest", "-q"])))
    width = max(len(r[0]) for r in rows)
    print(f"{'what'.ljust(width)}  seconds   (nproc={os.cpu_count()})")
    for what, secs in rows:
        print(f"{what.ljust(width)}  {secs:7.1f}")
    print(json.dumps({w: round(s, 1) for w, s in rows}))


if __name__ == "__main__":
    main()
