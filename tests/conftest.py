"""Synthesize each declared environment once per session, on first use; every test reads
from that.

The gates run on every environment the repository declares (environments/NAME.json and the
China variant of each with a `chinaVariant`: config.context.declared_environments), so a team
that adds one gets every gate for it with no edit here. `--environment NAME` (repeatable)
narrows the gates to those environments.

An environment's snapshots live beside its file, environments/snapshots/NAME/ (one folder per
environment, `EnvironmentSnapshots`): `make snapshots ENV=NAME` records that folder and touches
no other, and an update of this repository never conflicts with a team's. A failing test of an
environment says whose it is (`pytest_runtest_makereport`): the team's file, its snapshots, or
a bug of this repository.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import kubernetes_validate.utils
import pytest
import yaml
from syrupy.extensions.amber import AmberSnapshotExtension

from config import ConfigError, EnvironmentConfig, resolve_environment
from config.context import ENVIRONMENTS_DIR, SNAPSHOTS_DIR, declared_environments, \
    repository_context
from tests.lanes import runs_here, yield_to_lane_1

ROOT = Path(__file__).resolve().parent.parent
try:
    DECLARED = declared_environments(ROOT)     # name -> the context that selects it
    _UNREADABLE: ConfigError | None = None
except ConfigError as err:   # a file of environments/ that is not an environment: said once
    DECLARED, _UNREADABLE = {}, err
# The environments the gates run on: every declared one, or those `--environment` names (the
# list is narrowed in place before any test module is imported).
ENVIRONMENTS: list[str] = sorted(DECLARED)
_HASH = re.compile(r"[0-9a-f]{64}")
# libyaml's safe reader and emitter (PyYAML's wheels carry it): the same documents, a tenth of
# the pure-Python one's CPU, for the large texts the tests read back or hand to checkov
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

# kubernetes-validate reads and parses the kind's schema and the 1.5 MB _definitions.json on
# every call (most of its ~15 ms; the suite validates about a thousand objects). Both are files
# of the installed package, parsed the same every time: read each once per session. The
# validation itself still runs on every object.
kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(
    kubernetes_validate.utils.schema_contents)


def pytest_addoption(parser):
    parser.addoption("--environment", action="append", default=[], metavar="NAME",
                     help="run the per-environment gates on this declared environment only "
                          "(repeatable; default: every declared one)")


def pytest_configure(config):
    yield_to_lane_1(config)
    if _UNREADABLE is not None:
        raise pytest.UsageError(f"your file: {_UNREADABLE}")
    chosen = config.getoption("--environment")
    unknown = sorted(set(chosen) - set(DECLARED))
    if unknown:
        raise pytest.UsageError(f"--environment {unknown[0]}: not declared; declared: "
                                f"{', '.join(sorted(DECLARED))}")
    if chosen:
        ENVIRONMENTS[:] = [n for n in ENVIRONMENTS if n in chosen]


def narrowed() -> bool:
    """True when `--environment` left some declared environment out."""
    return set(ENVIRONMENTS) != set(DECLARED)


@dataclass
class Synth:
    cfg: EnvironmentConfig
    stacks: object            # stacks.app_builder.EnvironmentStacks
    outdir: Path
    templates: dict[str, dict]  # stack name -> template
    _lint: object = field(default=None, repr=False)

    def template(self, suffix: str) -> dict:
        return self.templates[f"{self.cfg.stack_prefix}-{suffix}"]

    def cfn_lint(self):
        """cfn-lint over this environment's templates in its region (tests.lint.CfnLint),
        started on first call (at synth when the session runs the cfn-lint gate)."""
        from tests.lint import CfnLint

        if self._lint is None:
            self._lint = CfnLint((self.cfg.region,),
                                 sorted(str(p) for p in self.outdir.glob("*.template.json")))
        return self._lint


class EnvironmentSnapshots(AmberSnapshotExtension):
    """Snapshots of one environment in a folder of its own, environments/snapshots/NAME/ (one
    file per test module), NAME the test's `name` parameter. syrupy finds unused snapshots
    only in the folders of the environments that ran, so `--snapshot-update` narrowed to one
    environment deletes nothing of another's."""

    @classmethod
    def dirname(cls, *, test_location) -> str:
        return str(snapshot_folder(_environment_of(test_location.item)))

    @classmethod
    def discovery_dirname(cls, *, test_location) -> str:
        """Where syrupy looks for unused snapshots: the folder of an environment the gates
        run on, and only from a test that stores there (a test parametrized by another
        environment, like `name` in ["china", "dev-cn"], must not open that one's folder)."""
        item, name = test_location.item, _environment_of(test_location.item)
        mine = ("environment_snapshot" in getattr(item, "fixturenames", ())
                and name in ENVIRONMENTS)
        return str(snapshot_folder(name if mine else None))


def snapshot_folder(name: str | None) -> Path:
    """Where environment NAME's snapshots live (for a test of no environment: a folder that
    does not exist, so syrupy finds nothing there)."""
    return ROOT / ENVIRONMENTS_DIR / SNAPSHOTS_DIR / (name or ".none")


def _environment_of(item) -> str | None:
    """The declared environment a test item runs on: its parameter that names one."""
    params = getattr(item, "callspec", None)
    return next((v for v in (params.params.values() if params else ())
                 if isinstance(v, str) and v in DECLARED), None)


@pytest.fixture
def environment_snapshot(snapshot, request):
    """`snapshot`, stored with the environment the test is parametrized by (`name`)."""
    assert _environment_of(request.node), "environment_snapshot: a test of an environment"
    return snapshot.use_extension(EnvironmentSnapshots)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test of a declared environment says whose it is: the environment's file (it
    does not resolve: the line names file and field), its snapshots, or ours (the environment
    resolves, so every gate must pass on it)."""
    outcome = yield
    report = outcome.get_result()
    name = _environment_of(item)
    if not (report.failed and name and hasattr(report.longrepr, "addsection")):
        return
    file = f"{ENVIRONMENTS_DIR}/{DECLARED[name]['env']}.json"
    snapshot = item.funcargs.get("environment_snapshot")
    if call.excinfo is not None and call.excinfo.errisinstance(ConfigError):
        synth = " ".join(f"{'ENV' if k == 'env' else k.upper()}={v}"
                         for k, v in DECLARED[name].items())
        text = (f"your file: {call.excinfo.value}. Fix the field this line names (in {file} "
                f"or the endpoint file it names); `make synth {synth}` says the same")
    elif snapshot is not None and any(not r.success for r in snapshot.executions.values()):
        text = (f"your snapshots: {name}'s in {snapshot_folder(name).relative_to(ROOT)}/ "
                "are missing or differ from what it renders now (after a change of "
                f"{file} or an update of this repository): review the diff, then record them "
                f"with `make snapshots ENV={name}` (it touches that folder only)")
    else:
        text = (f"our bug: {file} resolves (every field of it is valid), so every gate must "
                f"pass on {name}; this one does not: a bug of this repository, not of your "
                "file. Report it with this output")
    report.longrepr.addsection("kvcache: whose failure", text)


def context_for(**overrides: str) -> dict:
    """The repository's context; `env` defaults to the dev sample (tests of its properties)."""
    return {**repository_context(ROOT), "env": "dev", **overrides}


def normalise(text: str) -> str:
    """Asset hashes differ across machines (zip metadata): snapshots must not see them."""
    return _HASH.sub("<hash>", text)


def _synth(name: str, tmp: Path) -> Synth:
    import aws_cdk as cdk

    from stacks.app_builder import build

    from k8s.serving import load_endpoints

    ctx = context_for(**DECLARED[name])
    cfg = resolve_environment(ctx)
    app = cdk.App(context=ctx, outdir=str(tmp / name))
    stacks = build(app, cfg, load_endpoints(cfg, ROOT))
    assembly = app.synth()
    templates = {s.stack_name: s.template for s in assembly.stacks}
    return Synth(cfg, stacks, Path(assembly.directory), templates)


# Whether a selected test asks for cfn-lint over the environments' templates (the `cfn_lint`
# fixture): then each environment's lint starts in the background as soon as it is synthesized.
_LINT_AT_SYNTH = False
# Whether a selected test reads checkov's scan (tests/test_checkov.py), and with the
# disaggregated renders: then it starts in the background once every environment is.
_CHECKOV_AT_SYNTH: bool | None = None


def pytest_collection_finish(session):
    global _LINT_AT_SYNTH, _CHECKOV_AT_SYNTH
    items = [item for item in session.items if runs_here(session.config, item)]
    _LINT_AT_SYNTH = any("cfn_lint" in getattr(item, "fixturenames", ()) for item in items)
    if any("scans" in getattr(item, "fixturenames", ()) for item in items):
        from tests.test_checkov import reads_pd
        _CHECKOV_AT_SYNTH = reads_pd(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`-n N` without `--dist` (`make test`): tests/lanes.py's scheduling."""
    if config.getoption("dist") == "load":
        from tests.lanes import LaneScheduling
        return LaneScheduling(config, log)
    return None


class Synths(dict):
    """name -> Synth, each environment synthesized the first time a test asks for it (a run
    narrowed by -k or --environment synthesizes only what it uses)."""

    def __init__(self, tmp: Path):
        super().__init__()
        self._tmp = tmp
        self._refused: dict[str, ConfigError] = {}
        self.checkov = None   # tests.background.Background of tests/test_checkov.py's scan

    def __missing__(self, name: str) -> Synth:
        if name not in DECLARED:
            raise KeyError(name)
        if name in self._refused:   # the team's file: said once per test, synthesized once
            raise self._refused[name]
        try:
            synth = _synth(name, self._tmp)
        except ConfigError as err:
            self._refused[name] = err
            raise
        self[name] = synth
        if _LINT_AT_SYNTH:
            synth.cfn_lint()
        if (_CHECKOV_AT_SYNTH is not None and self.checkov is None
                and all(n in self for n in ENVIRONMENTS)):
            from tests.test_checkov import start_scan
            files = self._tmp / "checkov"
            files.mkdir()
            self.checkov = start_scan(self, files, _CHECKOV_AT_SYNTH)
        return synth

    def all(self) -> dict[str, Synth]:
        """Every environment the gates run on, synthesized."""
        return {name: self[name] for name in ENVIRONMENTS}


class Lazy(dict):
    """key -> make(key), computed on first use (module fixtures keyed by environment)."""

    def __init__(self, make):
        super().__init__()
        self._make = make

    def __missing__(self, key):
        self[key] = value = self._make(key)
        return value


@pytest.fixture(scope="session")
def synths(tmp_path_factory) -> Synths:
    return Synths(tmp_path_factory.mktemp("cdk"))


@pytest.fixture(scope="session")
def cfn_lint(synths):
    """``cfn_lint(name)`` -> tests.lint.CfnLint over that environment's templates in its
    region. A session whose tests ask for this fixture starts each environment's lint as soon
    as it is synthesized."""
    return lambda name: synths[name].cfn_lint()


_EARLY: dict = {}   # start function -> tests.background.Early


def _start_early(start, tmp_path_factory):
    from tests.background import Early

    if start not in _EARLY:
        tmp = tmp_path_factory.mktemp(start.__name__.strip("_"))
        _EARLY[start] = Early(tmp, start(tmp))
    return _EARLY[start]


@pytest.fixture(scope="session", autouse=True)
def _starts_early(request, tmp_path_factory):
    """Start the runs of the selected `starts_early` tests (tests/background.py) at once (under
    xdist: those this worker runs, tests/lanes.py)."""
    for item in request.session.items:
        if (marker := item.get_closest_marker("starts_early")) and runs_here(request.config,
                                                                             item):
            _start_early(marker.kwargs["start"], tmp_path_factory)
    yield
    for early in _EARLY.values():
        early.run.stop()


@pytest.fixture
def early(request, tmp_path_factory):
    """The Early (scratch directory, running subprocess) of this `starts_early` test."""
    return _start_early(request.node.get_closest_marker("starts_early").kwargs["start"],
                        tmp_path_factory)


@pytest.fixture(scope="session")
def dev(synths) -> Synth:
    """The shipped global sample (environments/dev.json): tests of its own properties."""
    return synths["dev"]


@pytest.fixture(scope="session")
def china(synths) -> Synth:
    """The shipped China sample (environments/china.json)."""
    return synths["china"]


def resources(template: dict, type_: str) -> dict[str, dict]:
    return {k: v for k, v in template.get("Resources", {}).items() if v["Type"] == type_}


def dumps(obj) -> str:
    return json.dumps(obj, sort_keys=True)


@pytest.fixture(scope="module")
def sound_l2_client():
    """For tests of the in-cluster L2 itself (its Valkey, exporter, scheduling, verdicts): the
    image's in-cluster client taken as one that passes the fault drill (k8s/l2.py CLIENT_FAULTS
    emptied). LMCache 0.5.4's fails it: tests/k8s/test_l2_client_faults.py holds that, and what
    synth does then."""
    from unittest import mock

    import k8s.l2
    with mock.patch.dict(k8s.l2.CLIENT_FAULTS, clear=True):
        yield
