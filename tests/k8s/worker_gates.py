"""First-deploy gates for the worker pods, run on every shipped environment and every
published corpus file (tests/k8s/test_worker_gates.py, tests/k8s/test_hyperpod_corpus.py).

Entrypoint: for each image family, a fake root laid out as its published Dockerfile lays it out
(config/images.py: PATH, where `vllm` and the python with vllm live, the system python3 that
has none) holds stub executables that record their argv. The rendered container command and
args run under the real /bin/sh with that PATH and must reach vLLM with exactly the rendered
args, the API key read from its file, and the metrics directory emptied.

Memory: LMCache's L1 per rank x ranks + vLLM's host memory + /dev/shm within the container's
memory limit, read from the rendered manifests (the ConfigMap LMCache reads, the args vLLM
gets, the shm volume), not from our own sizing code.

Layerwise: where the ConfigMap says `use_layerwise: true`, every forward step of the image's
vLLM, run with the rendered args, must call LMCache's per-layer hooks: no full CUDA graph, no
async scheduling (k8s/workers.py LAYERWISE_GUARD says why). `vllm_steps` is what vLLM makes of
the args, per release, as read in its own source, not in ours.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Mapping

import yaml

from config.images import (
    IMAGE_FAMILIES, Image, ImageFamily, built_from_stated, image_family, image_for, image_release,
)
from config.endpoint_spec import _gib
from k8s.secret_fetch import API_KEY_FILE
from k8s.workers import (
    API_SERVER_MODULE, PROMETHEUS_DIR, VLLM_HOST_GIB_BASE, VLLM_HOST_GIB_PER_RANK,
    parallel_ranks,
)

API_KEY = "k3y-from-secrets-manager"
# A stub that records how it was called; the python stubs import vllm only where it exists.
_STUB = """#!/bin/sh
printf '%s\\n' "$0" > "$RECORD"
for a in "$@"; do printf '%s\\0' "$a"; done > "$RECORD.argv"
printf '%s' "${{VLLM_API_KEY-<unset>}}" > "$RECORD.key"
{check}
exit 0
"""
_NO_VLLM = """case "$1 $2" in "-m vllm"*) echo "No module named 'vllm'" >&2; exit 1;; esac"""


def _stub(path: Path, check: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_STUB.format(check=check))
    path.chmod(0o755)


def fake_root(tmp: Path, family: ImageFamily) -> Path:
    """The family's filesystem, as far as starting vLLM goes."""
    root = tmp / family.key
    _stub(root / family.vllm.lstrip("/"))
    _stub(root / family.python.lstrip("/"))
    for other in family.other_pythons:
        _stub(root / other.lstrip("/"), _NO_VLLM)
    venv = Path(family.python).parent
    if str(venv) in family.path:      # the venv's python3 alias, as `python -m venv` makes it
        _stub(root / str(venv / "python3").lstrip("/"))
    for d in family.path:
        (root / d.lstrip("/")).mkdir(parents=True, exist_ok=True)
    for tool in ("cat", "rm"):         # coreutils of the Ubuntu base every family has
        (root / "bin" / tool).symlink_to(shutil.which(tool))
    key = root / API_KEY_FILE.lstrip("/")
    key.parent.mkdir(parents=True, exist_ok=True)
    key.write_text(API_KEY)
    metrics = root / PROMETHEUS_DIR.lstrip("/")
    metrics.mkdir(parents=True, exist_ok=True)
    (metrics / "counter_1.db").write_text("stale")    # the last run's files
    return root


def _in_root(root: Path, token: str) -> str:
    """Absolute image paths in the command, moved under the fake root (the real /bin/sh stays)."""
    for prefix in ("/opt/", "/usr/local/bin/", "/usr/bin/python", "/run/"):
        token = token.replace(prefix, f"{root}{prefix}")
    return token


def run_container(root: Path, family: ImageFamily, container: dict, tmp: Path) -> dict:
    """Run the rendered container's command + args in the fake root; what the stub saw."""
    record = tmp / f"record-{family.key}"
    for f in tmp.glob(f"record-{family.key}*"):
        f.unlink()
    argv = [_in_root(root, a) for a in container["command"]] + list(container["args"])
    env = {e["name"]: e.get("value", "") for e in container["env"]}
    env.update(PATH=":".join(f"{root}{d}" for d in family.path), RECORD=str(record),
               PROMETHEUS_MULTIPROC_DIR=_in_root(root, env.get("PROMETHEUS_MULTIPROC_DIR", "")))
    env.pop("VLLM_API_KEY", None)
    # The start-up shell empties the metrics directory with the real rm: anywhere outside the
    # fake root (a /tmp, say) it would empty this machine's directory. The gate fails instead.
    metrics_dir = env["PROMETHEUS_MULTIPROC_DIR"]
    assert not metrics_dir or metrics_dir.startswith(f"{root}/"), (
        f"{family.key}: PROMETHEUS_MULTIPROC_DIR {metrics_dir!r} is not the workers' own "
        f"emptyDir ({PROMETHEUS_DIR}): the start-up shell would empty it")
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    seen = {"rc": proc.returncode, "stderr": proc.stderr}
    if record.exists():
        seen.update(binary=record.read_text().strip(),
                    argv=record.with_name(record.name + ".argv").read_text().split("\0")[:-1],
                    key=record.with_name(record.name + ".key").read_text())
    seen["stale_metrics"] = any((root / PROMETHEUS_DIR.lstrip("/")).iterdir())
    return seen


def assert_reaches_vllm(seen: dict, root: Path, family: ImageFamily, container: dict,
                        api_key: bool) -> None:
    """vLLM started: `vllm serve` with a model, or a python that has vllm running the API
    server module; with exactly the rendered args, the key, and no stale metrics."""
    where = f"{family.key}: {container['command'][3:]}"
    assert seen["rc"] == 0 and "binary" in seen, (where, seen["stderr"][-500:])
    tail = container["command"][4:]          # after `/bin/sh -c SCRIPT vllm`
    expected = (["serve"] if not tail else tail[1:]) + list(container["args"])
    assert seen["argv"] == expected, where
    if seen["argv"][0] == "serve":
        assert seen["binary"] == f"{root}{family.vllm}", where
        rest = seen["argv"][1:]
        assert "--model" in rest or not rest[0].startswith("-"), where   # a model to serve
    else:
        assert seen["argv"][:2] == ["-m", API_SERVER_MODULE], where
        assert seen["argv"][2].startswith("-") and "--model" in seen["argv"], where
    assert seen["key"] == (API_KEY if api_key else "<unset>"), where
    assert not seen["stale_metrics"], where


def stated_image(image_ref: str, bases: Mapping[str, str] | None = None) -> Image:
    """The catalogue's or the file's image, built FROM the base the environment's
    `imageBases` states for it (as k8s/serving.py fit_endpoint reads it)."""
    return built_from_stated(image_for(image_ref), bases or {})


def families_for(image_ref: str, bases: Mapping[str, str] | None = None
                 ) -> tuple[ImageFamily, ...]:
    """The layout(s) to run a worker image in: its family (stated by `bases` for a team's
    image), or for an image we do not know every family (the start-up shell must find vLLM
    in any of them)."""
    family = image_family(stated_image(image_ref, bases))
    return (family,) if family else IMAGE_FAMILIES


# a colocated endpoint's workers, and a disaggregated one's prefill and decode workers
WORKER_SUFFIXES = ("-workers", "-prefill", "-decode")


def worker_containers(docs: list[dict]) -> list[tuple[dict, dict]]:
    """(pod spec, vllm container) of every worker workload."""
    out = []
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet") and d["metadata"]["name"].endswith(
                WORKER_SUFFIXES):
            pod = d["spec"]["template"]["spec"]
            out.append((pod, next(c for c in pod["containers"] if c["name"] == "vllm")))
    return out


def memory_budget(docs: list[dict], pod: dict, container: dict) -> dict:
    """The worker container's memory, as the rendered objects set it."""
    config_map = next(v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v)
    cm = next(d for d in docs if d["kind"] == "ConfigMap"
              and d["metadata"]["name"] == config_map)
    l1 = yaml.safe_load(cm["data"]["lmcache.yaml"])
    per_rank = l1["max_local_cpu_size"] if l1.get("local_cpu") else 0
    ranks = parallel_ranks(container["args"])
    shm = next(v["emptyDir"] for v in pod["volumes"] if v["name"] == "dshm")
    limit = _gib(container["resources"]["limits"]["memory"])
    host = VLLM_HOST_GIB_BASE + VLLM_HOST_GIB_PER_RANK * ranks
    used = ranks * per_rank + host + _gib(shm["sizeLimit"])
    return {"limit": limit, "used": used, "ranks": ranks, "l1_per_rank": per_rank,
            "l1": bool(l1.get("local_cpu")),
            "gpus": int(container["resources"]["limits"]["nvidia.com/gpu"])}


def lmcache_configs(docs: list[dict]) -> dict[str, str]:
    """Endpoint workers name -> the LMCache YAML its ConfigMap carries."""
    return {d["metadata"]["name"].removesuffix("-lmcache"): d["data"]["lmcache.yaml"]
            for d in docs if d["kind"] == "ConfigMap"
            and d["metadata"]["name"].endswith(tuple(f"{s}-lmcache" for s in WORKER_SUFFIXES))}



# What a vLLM release does with its step flags, from its source (sdists on PyPI):
# - cudagraph_mode when not given: PIECEWISE in 0.10.2 (config/__init__.py), FULL_AND_PIECEWISE
#   from 0.11.0 (config/__init__.py, later config/vllm.py); --enforce-eager makes it NONE;
#   --compilation-config (-O, -cc) is JSON whose `cudagraph_mode` is a mode's name
#   (compilation.py validate_cudagraph_mode_before: CUDAGraphMode[value.upper()]).
# - async scheduling: off unless --async-scheduling up to 0.13.0 (`async_scheduling: bool =
#   False`), on unless --no-async-scheduling from 0.14.0 (None, resolved to True in
#   config/vllm.py for a single-node, non-speculative engine).
FULL_GRAPHS_SINCE = (0, 11, 0)
ASYNC_SCHEDULING_SINCE = (0, 14, 0)


def vllm_steps(vllm: tuple[int, int, int] | None, args: list[str]) -> tuple[str, bool] | None:
    """(cudagraph_mode, async scheduling) vLLM `vllm` runs with `args`; None if unknown."""
    if vllm is None:
        return None
    mode = "FULL_AND_PIECEWISE" if vllm >= FULL_GRAPHS_SINCE else "PIECEWISE"
    asynchronous = vllm >= ASYNC_SCHEDULING_SINCE
    eager = False
    for i, arg in enumerate(args):
        flag, _, value = arg.partition("=")
        flag = flag.replace("_", "-")
        if flag in ("--compilation-config", "-O", "-cc"):
            config = json.loads(value or args[i + 1])
            mode = str(config.get("cudagraph_mode", mode)).upper()
        elif flag == "--enforce-eager":
            eager = True
        elif flag == "--async-scheduling":
            asynchronous = True
        elif flag == "--no-async-scheduling":
            asynchronous = False
    return ("NONE" if eager else mode), asynchronous


def upstream_ref(image: str) -> str:
    """An ECR mirror reference back to its upstream path (kvcache/<path>:<tag>)."""
    return image.split("/kvcache/", 1)[1] if "/kvcache/" in image else image


def assert_layerwise_is_guarded(docs: list[dict], bases: Mapping[str, str] | None = None
                                ) -> bool:
    """Every worker that stores layerwise runs each step through LMCache's layer hooks, in the
    vLLM its image carries (config/images.py image_release). Returns whether any worker stores
    layerwise (so callers can check the gate saw one)."""
    configs = lmcache_configs(docs)
    seen = False
    for pod, container in worker_containers(docs):
        name = next(v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v)
        config = yaml.safe_load(configs[name.removesuffix("-lmcache")])
        if not config.get("use_layerwise"):
            continue
        seen = True
        vllm = image_release(stated_image(upstream_ref(container["image"]), bases)).vllm
        steps = vllm_steps(vllm, container["args"])
        assert steps is not None, ("layerwise for an image whose vLLM is unknown", name)
        mode, asynchronous = steps
        assert mode in ("PIECEWISE", "NONE") and not asynchronous, (name, mode, asynchronous)
    return seen
