"""A P/D worker can pin its KV cache for EFA: the securityContext we render, applied to a real
process as runc applies a container's, then mlock past the container's memlock limit.

NIXL registers the KV cache with EFA, and registering host memory pins it, charged to
RLIMIT_MEMLOCK unless the process holds CAP_IPC_LOCK. The EKS AL2023 AMI's base runtime spec
(nodeadm/internal/containerd/base-runtime-spec.json) sets RLIMIT_NOFILE only, so a container
keeps the kernel's 8 MiB. Adding IPC_LOCK to a non-root container does nothing (kubernetes
#56374: the CRI sets no ambient set, and a non-root execve drops the permitted set without file
capabilities). No container runtime runs here; the stand-in below does runc's steps, in its
order (libcontainer's init: bounding set, keep-caps and the user, capset of permitted,
effective and inheritable, no_new_privs, execve), on the real kernel, as root.
"""
from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import sys

import pytest

from bench.pd_render import rendered
from tests.k8s.test_pd import RENDERS

CAPS = {"IPC_LOCK": 14}   # linux/capability.h
LIMIT = 8 << 20           # the kernel's default RLIMIT_MEMLOCK, the container's on EKS
PIN = 64 << 20            # more than the limit: a KV region is GiBs
_PR_SET_KEEPCAPS, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS = 8, 24, 38

# Runs as the container's first process: pins PIN bytes, says whether it could.
PIN_SCRIPT = f"""
import ctypes, mmap, sys
libc = ctypes.CDLL(None, use_errno=True)
buf = mmap.mmap(-1, {PIN})
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
ok = libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t({PIN})) == 0
print("pinned" if ok else "refused errno %d" % ctypes.get_errno())
sys.exit(0 if ok else 3)
"""


def _as_container(context: dict) -> subprocess.CompletedProcess:
    """Start PIN_SCRIPT under `context` (a container securityContext) as runc would."""
    caps = [CAPS[c] for c in context["capabilities"].get("add", [])]
    assert context["capabilities"]["drop"] == ["ALL"]
    uid = context.get("runAsUser", 0)
    gid = context.get("runAsGroup", uid)
    no_new_privs = not context.get("allowPrivilegeEscalation", True)

    def runc_init() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (LIMIT, LIMIT))
        last = int(open("/proc/sys/kernel/cap_last_cap").read())
        for cap in range(last + 1):                      # 1. the bounding set
            if cap not in caps and libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0):
                raise OSError(ctypes.get_errno(), "PR_CAPBSET_DROP")
        libc.prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0)         # 2. the user, keeping caps across it
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        mask = sum(1 << c for c in caps)                 # 3. permitted, effective, inheritable

        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

        class Data(ctypes.Structure):
            _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                        ("inheritable", ctypes.c_uint32)]

        data = (Data * 2)(Data(mask, mask, mask), Data(0, 0, 0))
        if libc.capset(ctypes.byref(Header(0x20080522, 0)), data):
            raise OSError(ctypes.get_errno(), "capset")
        if no_new_privs and libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0):   # 4.
            raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
        # 5. execve (subprocess's)

    return subprocess.run(["/usr/bin/python3", "-I", "-c", PIN_SCRIPT], preexec_fn=runc_init,
                          capture_output=True, text=True, timeout=60, cwd="/")


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not sys.platform.startswith("linux"),
    reason="applying a container's user and capabilities takes root on Linux, as runc has")


@needs_root
@pytest.mark.parametrize("env,itype", RENDERS)
def test_the_rendered_pd_worker_pins_past_the_memlock_limit(env, itype):
    r = rendered(env, itype)
    workers = [c for d in r.docs if d["kind"] == "Deployment"
               and d["metadata"]["name"].endswith(("-prefill", "-decode"))
               for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
    assert len(workers) == 2
    for c in workers:
        run = _as_container(c["securityContext"])
        assert run.returncode == 0 and run.stdout.strip() == "pinned", run.stdout + run.stderr


@needs_root
def test_the_same_capability_under_a_non_root_user_does_nothing():
    """Why the worker is root: the context we rendered before, on the same stand-in."""
    context = {"capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]}, "runAsUser": 10001,
               "runAsGroup": 10001, "allowPrivilegeEscalation": False}
    run = _as_container(context)
    assert run.returncode == 3 and run.stdout.startswith("refused"), run.stdout + run.stderr
    no_cap = {"capabilities": {"drop": ["ALL"]}, "runAsUser": 0, "allowPrivilegeEscalation": False}
    assert _as_container(no_cap).returncode == 3      # root without it is held to the limit
