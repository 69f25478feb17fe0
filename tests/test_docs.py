"""The docs speak of the repository only, every command, file and link they name exists and
parses, the README is a short map, and the day-two page says which command needs AWS."""
from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import io
import re
import shlex
import subprocess
from pathlib import PurePath

import pytest

from tests.conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Our own tracker's numbers mean nothing to a user; an upstream `owner/repo#N` does.
OURS = re.compile(r"\b[Ii]ssues? \d+|(?<![\w/.-])#\d+\b|\.\./shared|FACTS\.md")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_docs_point_nowhere_outside_the_repository(doc):
    found = [(n, m.group()) for n, line in enumerate(doc.read_text().splitlines(), 1)
             for m in OURS.finditer(line)]
    assert found == [], found


def test_every_day_two_command_is_run_by_a_test_or_needs_an_account():
    text = (ROOT / "docs" / "operations.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    commands = [line for block in blocks for line in block.splitlines() if line.strip()]
    assert len(commands) >= 8
    for line in commands:
        marker = re.search(r"#\s*(needs an account|run by (tests/\S+))", line)
        assert marker, line
        if marker.group(2):
            assert (ROOT / marker.group(2)).exists(), line
    for tool in re.findall(r"python -m tools (\S+)", text):   # the tools it names exist
        assert (ROOT / "tools" / f"{tool.replace('-', '_')}.py").exists() or tool in (
            "bench", "calibrate", "bench-compare"), tool


# --- Every command and file the docs name exists and parses -------------------------------------
# A reader copies what the docs show; a renamed flag, tool, target or file must fail here, not in
# their shell. Commands are parsed in-process by the real argparse parsers (no subprocess, no run).

README = ROOT / "README.md"
PATH_PAGES = ("quickstart", "china", "existing-vpc", "hyperpod")   # one page per case
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"`([^`\n]+)`")
PY = re.compile(r"python -m (tools|bench\.\w+|tests\.[\w.]+)\b")
PLACEHOLDER = re.compile(r"<|>|\*|\{|\$|\.\.\.|\bNAME\b|\bDIR\b|\bE\b|\bX\b|\bID\b")


class _Parsed(Exception):
    """Raised by parse_args once the arguments parsed: the command is never run."""


def _commands(text: str) -> tuple[list[str], list[str]]:
    """(command lines of the code blocks, \\-continuations joined and comments cut; inline spans)."""
    blocks = []
    for block in FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                blocks.append(line)
    spans = [s for s in SPAN.findall(FENCE.sub("", text))]
    return blocks, spans


@functools.lru_cache(maxsize=None)   # the docs repeat commands: parse each once
def _parse(argv: tuple[str, ...]) -> tuple[int, str]:
    """Run the named module's main on argv with parse_args stopped after parsing: 0 when the
    arguments parse (or --help printed), argparse's exit code otherwise; and what it printed."""
    module = importlib.import_module("tools.__main__" if argv[2] == "tools" else argv[2])
    original = argparse.ArgumentParser.parse_args

    def stop(self, args=None, namespace=None):
        original(self, args, namespace)
        raise _Parsed

    out = io.StringIO()
    argparse.ArgumentParser.parse_args = stop
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            module.main(list(argv[3:]))
    except _Parsed:
        return 0, out.getvalue()
    except SystemExit as e:
        return int(e.code or 0), out.getvalue()
    finally:
        argparse.ArgumentParser.parse_args = original
    raise AssertionError(f"{' '.join(argv)}: ran past its parser")


def _make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


def _declared_environments() -> set[str]:
    return {p.stem for p in (ROOT / "environments").glob("*.json")}


@pytest.fixture(scope="module")
def tracked() -> set[str]:
    """The repository's files and folders (git's list; the files on disk outside a checkout)."""
    run = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    files = run.stdout.splitlines() if run.returncode == 0 and run.stdout else [
        str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()]
    return set(files) | {str(p) for f in files for p in PurePath(f).parents}


def test_the_readme_is_a_map_with_a_page_per_path():
    text = README.read_text()
    assert len(text.split()) < 1500, len(text.split())
    for page in PATH_PAGES:
        assert f"](docs/{page}.md)" in text, page
    # the two commands of the set-up, the test command
    assert "make synth" in text and "make test" in text


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_command_a_doc_shows_parses(doc):
    text = doc.read_text()
    blocks, spans = _commands(text)
    targets, envs = _make_targets(), _declared_environments()
    for line in blocks + spans:
        for m in re.finditer(r"(?:^|&&\s*)make ([a-z][\w-]*)", line):   # a Makefile target
            assert m.group(1) in targets, (doc.name, line)
        if line.startswith("cdk "):
            words = line.split()
            assert words[1] in ("bootstrap", "deploy", "destroy", "diff", "init", "synth", "list"), line
            for word in words:
                if word.startswith("KvCache-"):   # KvCache-<env>-<Stack>
                    assert word.rsplit("-", 1)[1] in (
                        "Network", "Storage", "Observability", "Cluster", "Cache", "Monitoring",
                        "Serving"), (doc.name, line)
            for key, value in re.findall(r"-c (\w+)=(\S+)", line):
                assert key in ("env", "china"), (doc.name, line)
                assert key != "env" or value in envs or PLACEHOLDER.search(value) or \
                    value == "prod-cn", (doc.name, line)   # prod-cn: the docs' new environment
    for line in blocks + spans:
        m = PY.search(line)
        if not m:
            continue
        words = shlex.split(line[m.start():].replace("$", ""), comments=True)
        head = words[:3] + ([words[3]] if m.group(1) == "tools" and len(words) > 3 else [])
        if PLACEHOLDER.search(" ".join(head)):   # `python -m tools <command>`
            continue
        # every tool subcommand and module the doc names has a --help that exits 0
        assert _parse((*head, "--help"))[0] == 0, (doc.name, line)
        if re.search(r"\.\.\.|…|\{", line):
            continue
        code, said = _parse(tuple(words))   # its flags too; a span may leave required ones out
        assert code == 0 or (line in spans and "required" in said), (doc.name, line, said)


# Paths the docs name as examples of a team's own (not in the repository).
# endpoints/bench.yaml: the name the benchmark gives its in-memory endpoint (bench/tiers.py).
EXAMPLES = {"environments/prod-cn.json", "endpoints/my-endpoint.yaml",
            "environments/snapshots/prod-cn", "endpoints/bench.yaml"}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_file_a_doc_names_is_in_the_repository(doc, tracked):
    text = doc.read_text()
    tops = {t for t in tracked if "/" not in t}
    missing = []
    for token in SPAN.findall(text) + re.findall(r"(?<![\w/.-])((?:[\w.-]+/)+[\w.-]+)", text):
        token = token.strip().rstrip(".,:;)")
        if " " in token or "/" not in token or "://" in token or PLACEHOLDER.search(token):
            continue
        first = token.split("/", 1)[0]
        if first not in tops or first == "." or token.rstrip("/") in EXAMPLES:
            continue
        if token.rstrip("/") not in tracked:
            missing.append(token)
    assert missing == [], (doc.name, sorted(set(missing)))


def _anchors(page: str) -> set[str]:
    """GitHub's heading slugs: lowercase, punctuation but - and _ dropped, spaces to -."""
    heads = re.findall(r"^#+ (.+)$", FENCE.sub("", (ROOT / page).read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_link_of_a_doc_resolves(doc):
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
        if "://" in target:
            continue
        path, _, anchor = target.partition("#")
        page = (doc.parent / path).resolve() if path else doc
        assert page.exists(), (doc.name, target)
        if anchor:
            assert anchor in _anchors(str(page.relative_to(ROOT))), (doc.name, target)


def test_no_doc_or_help_says_an_environment_setting_lives_in_cdk_json():
    """cdk.json holds CDK's feature flags and defaultEnvironment; every other setting is a
    field of environments/NAME.json (docs/environments.md lists them)."""
    table = (ROOT / "docs" / "environments.md").read_text()
    fields = {f for row in re.findall(r"^\| (.+?) \|", table, re.M)
              for f in re.findall(r"`(\w+)", row)} - {"field"}
    assert {"endpoints", "existingVpc", "acknowledgedWarnings", "routerImplementations"} <= fields
    import bench.loopback_bench
    texts = {p.name: p.read_text() for p in [*DOCS, ROOT / "endpoints" / "README.md"]}
    texts["bench.loopback_bench"] = bench.loopback_bench.__doc__
    for name, text in texts.items():
        flat = " ".join(text.split())
        said = [f for f in fields if re.search(rf"`{f}`[^.]{{0,40}}`?cdk\.json", flat)]
        assert said == [], (name, said)
        assert "[ack:" not in flat, name   # the CLI prints Acknowledge with 'Annotation::ID'


@pytest.mark.parametrize("doc", DOCS + [
    ROOT / "endpoints" / "README.md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_prose_is_wrapped_to_be_read_in_a_terminal(doc):
    """Prose lines at most 100 columns (bench.routing.wrap_prose writes benchmarks.md so);
    tables, code, headings and markers may run longer."""
    long = [n for n, line in enumerate(FENCE.sub(lambda m: "\n" * m.group().count("\n"),
                                                 doc.read_text()).splitlines(), 1)
            if len(line) > 100 and not line.lstrip().startswith(("|", "#", "<!--"))
            and " " in line.strip()]   # one word (a long path) cannot wrap
    assert long == [], (doc.name, long)
