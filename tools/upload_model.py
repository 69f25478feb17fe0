"""Copy a model (a local directory, or a hub's model at a pinned revision) to the environment's
model bucket, under an endpoint's `modelLocation`, where the workers' init container
(`aws s3 sync`) fetches it.

    python -m tools upload-model --env dev --endpoint llama-8b-intel-routing ./Llama-3.1-8B-Instruct
    python -m tools upload-model --env china modelscope:Qwen/Qwen2.5-7B-Instruct --revision v1.0.0
    python -m tools upload-model --env dev hf:meta-llama/Llama-3.1-8B-Instruct --revision <commit>
    python -m tools upload-model --env china s3://team-weights/qwen2.5-7b-instruct

- From a hub (tools/hub.py): ModelScope inside China, the Hugging Face Hub in global regions
  (token from `--hf-token-secret` in Secrets Manager or $HF_TOKEN, never printed); downloaded
  into `--download-dir` (kept: a cut run resumes), checked against the hub's sizes and sha256s
  and the `--sha256`/`--hashes` given, then uploaded as a local directory is. `--dry-run` lists
  the hub's files and sizes with no AWS credentials, and the time at `--rate`.

- From S3 (`s3://BUCKET/PREFIX`: weights a team already holds in the account, e.g. carried into
  China with its own transfer tooling): copied inside S3 (no download), multipart and parallel
  through the transfer manager, each copy tagged with the source object's ETag so a second run
  skips what it copied and an interrupted one copies only what is missing; checked at the end
  (size and tag of every object). Needs the account's credentials, also for `--dry-run`.

- Multipart and parallel (s3transfer's TransferManager, one pool for every file).
- Every object carries an S3 SHA-256 checksum that S3 itself verified on arrival: full-object
  for a single PUT, composite (SHA-256 of the parts' SHA-256s, `-N` parts) for a multipart
  upload. ETags cannot stand in: with SSE-KMS (the bucket's default) they are not MD5s.
- Resumable: a file already there with the same size and the same checksum, computed locally
  with the part size the object was uploaded with, is skipped. An interrupted run leaves only
  whole objects behind (s3transfer aborts an unfinished multipart upload; the bucket's
  lifecycle rule reaps any it could not), so re-running finishes the job.
- Verified at the end: every object's checksum is read back and compared with the local file.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from config import ConfigError
from config.arguments import (
    ToolError, add_command, err_console, load_environment, out_console, pick_endpoint,
)
from config.context import ROOT
from config.files import MAX_FILE_BYTES, load_json_object
from config.models import RECORDED, shape_from_config_json
from tools.hub import HubModel, hf_token
from tools.cli import Aws, error_code, human_size, load_endpoints, parse_rate, transfer_estimate

MiB = 1024 * 1024
CHECKSUM = "SHA256"
# What vLLM needs to load a model from a directory (tokenizer files vary by model family).
REQUIRED = ("config.json",)
WEIGHTS = "*.safetensors"
_PREFIX = re.compile(r"[A-Za-z0-9._\-/]+")
_HASH_BLOCK = 8 * MiB


@dataclass(frozen=True)
class LocalFile:
    path: Path
    key: str
    size: int


@dataclass(frozen=True)
class RemoteObject:
    size: int
    checksum: str | None   # base64 SHA-256 (composite without its -N suffix), None if absent
    parts: int             # 0: a single PUT; N: a multipart upload of N parts
    part_size: int         # size of part 1 (every part but the last has it)


@dataclass
class UploadReport:
    bucket: str
    prefix: str
    files: int = 0
    bytes_total: int = 0
    uploaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    verified: int = 0
    extra: list[str] = field(default_factory=list)  # objects under the prefix not in the dir


# --------------------------------------------------------------------------- input


def scan_model_dir(source: Path, prefix: str) -> list[LocalFile]:
    """The files to upload (hidden files and folders such as `.cache/` left out), or a
    ToolError naming what is missing."""
    if not source.exists() or not source.is_dir():
        raise ToolError.bad_input("model_dir", str(source), "an existing directory")
    files = []
    for path in sorted(source.rglob("*")):
        rel = path.relative_to(source)
        if any(part.startswith(".") for part in rel.parts) or not path.is_file():
            continue
        files.append(LocalFile(path, f"{prefix}/{rel.as_posix()}", path.stat().st_size))
    top = {f.path.name for f in files if f.path.parent == source}
    if not any(Path(n).match(WEIGHTS) for n in top):
        raise ToolError.bad_input("model_dir", str(source),
                                  f"a model directory with {WEIGHTS} weights at its top level")
    for name in REQUIRED:
        if name not in top:
            raise ToolError.bad_input("model_dir", str(source),
                                      f"a model directory with {name} at its top level")
    return files


def check_prefix(prefix: str) -> str:
    prefix = prefix.strip("/")
    if not prefix or not _PREFIX.fullmatch(prefix) or ".." in prefix:
        raise ToolError.bad_input("--prefix", prefix,
                                  "an S3 key prefix of letters, digits, '.', '_', '-' and '/'")
    return prefix


def check_bucket(s3: Any, bucket: str, region: str) -> None:
    """The bucket exists, is ours to write, and is in the environment's region."""
    from botocore.exceptions import ClientError

    try:
        head = s3.head_bucket(Bucket=bucket)
    except ClientError as err:
        code = error_code(err)
        if code in ("404", "NoSuchBucket"):
            raise ToolError.bad_input("bucket", bucket,
                                      "an existing bucket (the Storage stack's ModelBucketName)")
        if code in ("403", "AccessDenied", "Forbidden"):
            raise ToolError.bad_input("bucket", bucket, "a bucket these credentials may write to")
        if code in ("301", "PermanentRedirect", "400"):
            raise ToolError.bad_input("bucket", bucket, f"a bucket in {region}")
        raise
    actual = head.get("BucketRegion") or head.get("ResponseMetadata", {}).get(
        "HTTPHeaders", {}).get("x-amz-bucket-region")
    if actual and actual != region:
        raise ToolError.bad_input("bucket", bucket, f"a bucket in {region} (it is in {actual})")


# --------------------------------------------------------------------------- checksums


class Hasher:
    """Local SHA-256 checksums the way S3 computes them, cached per file and part size."""

    def __init__(self, on_bytes: Callable[[int], None] | None = None) -> None:
        self._cache: dict[tuple, str] = {}
        self._lock = threading.Lock()
        self.on_bytes = on_bytes

    def checksum(self, f: LocalFile, parts: int, part_size: int) -> str:
        """Base64 SHA-256 of the file (parts == 0), or of its parts' digests (composite)."""
        st = f.path.stat()
        key = (str(f.path), st.st_size, st.st_mtime_ns, parts, part_size if parts else 0)
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        whole = hashlib.sha256()
        digests: list[bytes] = []
        part = hashlib.sha256()
        in_part = 0
        with open(f.path, "rb") as fh:
            while True:
                want = _HASH_BLOCK if not parts else min(_HASH_BLOCK, part_size - in_part)
                block = fh.read(want)
                if not block:
                    break
                if parts:
                    part.update(block)
                    in_part += len(block)
                    if in_part == part_size:
                        digests.append(part.digest())
                        part, in_part = hashlib.sha256(), 0
                else:
                    whole.update(block)
                if self.on_bytes:
                    self.on_bytes(len(block))
        if parts and in_part:
            digests.append(part.digest())
        raw = hashlib.sha256(b"".join(digests)).digest() if parts else whole.digest()
        value = base64.b64encode(raw).decode()
        with self._lock:
            self._cache[key] = value
        return value

    def matches(self, f: LocalFile, remote: RemoteObject | None) -> bool:
        if remote is None or remote.size != f.size or remote.checksum is None:
            return False
        if remote.parts and -(-f.size // max(remote.part_size, 1)) != remote.parts:
            return False
        return self.checksum(f, remote.parts, remote.part_size) == remote.checksum


def head_remote(s3: Any, bucket: str, key: str) -> RemoteObject | None:
    from botocore.exceptions import ClientError

    try:
        head = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    except ClientError as err:
        if error_code(err) in ("404", "NoSuchKey", "NotFound"):
            return None
        raise
    checksum = head.get("ChecksumSHA256")
    parts = 0
    if checksum and re.search(r"-\d+$", checksum):
        checksum, n = checksum.rsplit("-", 1)
        parts = int(n)
    etag = head.get("ETag", "").strip('"')
    if not parts and re.search(r"-\d+$", etag):  # a multipart object whatever the checksum says
        parts = int(etag.rsplit("-", 1)[1])
    if head.get("ChecksumType") == "COMPOSITE" and not parts:
        parts = int(head.get("PartsCount") or 0)
    part_size = 0
    if parts:
        part_size = s3.head_object(Bucket=bucket, Key=key, PartNumber=1)["ContentLength"]
    return RemoteObject(head["ContentLength"], checksum, parts, part_size)


# --------------------------------------------------------------------------- upload


@dataclass(frozen=True)
class UploadOptions:
    chunk_mib: int = 64
    concurrency: int = 10
    hash_workers: int = 4
    dry_run: bool = False


def upload_model(s3: Any, files: list[LocalFile], bucket: str, prefix: str,
                 opts: UploadOptions = UploadOptions(), *, show_progress: bool = True
                 ) -> UploadReport:
    """Plan (skip what is there), upload the rest in parallel, verify everything."""
    from rich.progress import (
        BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn,
    )

    report = UploadReport(bucket, prefix, len(files), sum(f.size for f in files))
    progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                        TransferSpeedColumn(), TimeRemainingColumn(), console=err_console,
                        disable=not show_progress, transient=False)
    with progress:
        # 1. what is there already (HEAD in parallel; hash only files whose size matches)
        check = progress.add_task("check", total=report.bytes_total)
        hasher = Hasher()
        remote: dict[str, RemoteObject | None] = {}

        def plan(f: LocalFile) -> bool:
            remote[f.key] = head_remote(s3, bucket, f.key)
            same = hasher.matches(f, remote[f.key])
            progress.advance(check, f.size)
            return same

        todo = _plan(report, s3, [f.key for f in files], files, plan, opts)
        if opts.dry_run:
            return report

        # 2. upload what is missing or different
        if todo:
            _transfer(s3, todo, bucket, opts, progress, report)

        # 3. verify every object against the local file
        verify = progress.add_task("verify", total=sum(f.size for f in files))
        hasher.on_bytes = lambda n: progress.advance(verify, n)
        done = [f for f in files if f.key not in report.failed]
        for f in done:
            if f.key in report.skipped:
                progress.advance(verify, f.size)  # compared a moment ago

        def verify_one(f: LocalFile) -> str | None:
            obj = remote[f.key] if f.key in report.skipped else head_remote(s3, bucket, f.key)
            return None if hasher.matches(f, obj) else f.key

        with ThreadPoolExecutor(opts.hash_workers) as pool:
            bad = [k for k in pool.map(verify_one, [f for f in done
                                                    if f.key not in report.skipped]) if k]
        for key in bad:
            report.failed[key] = "checksum in S3 differs from the local file after upload"
        report.verified = len(done) - len(bad)
    return report


def transfer_config(opts: UploadOptions) -> Any:
    """The transfer manager's settings for uploads and copies: parts of --chunk-mib, at most
    --concurrency requests (the classic client: checksums on every part)."""
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(
        multipart_threshold=opts.chunk_mib * MiB, multipart_chunksize=opts.chunk_mib * MiB,
        max_concurrency=opts.concurrency, use_threads=True, preferred_transfer_client="classic")


def _transfer(s3: Any, todo: list[LocalFile], bucket: str, opts: UploadOptions, progress: Any,
              report: UploadReport) -> None:
    from boto3.s3.transfer import create_transfer_manager
    from s3transfer.subscribers import BaseSubscriber

    config = transfer_config(opts)
    task = progress.add_task("upload", total=sum(f.size for f in todo))

    class _Progress(BaseSubscriber):
        def on_progress(self, future: Any, bytes_transferred: int, **kwargs: Any) -> None:
            progress.advance(task, bytes_transferred)

    manager = create_transfer_manager(s3, config)
    futures = []
    try:
        for f in todo:
            futures.append((f, manager.upload(
                str(f.path), bucket, f.key, extra_args={"ChecksumAlgorithm": CHECKSUM},
                subscribers=[_Progress()])))
        for f, future in futures:
            try:
                future.result()
                report.uploaded.append(f.key)
            except Exception as exc:  # one file's failure must not hide the others' success
                report.failed[f.key] = f"{type(exc).__name__}: {exc}"
    except KeyboardInterrupt:
        manager.shutdown(cancel=True, cancel_msg="interrupted")
        raise ToolError(f"interrupted after {len(report.uploaded)} of {len(todo)} files; "
                        "run the same command again to resume", exit_code=130) from None
    manager.shutdown()


def _plan(report: UploadReport, s3: Any, keys: list[str], items: list, there: Callable[[Any], bool],
          opts: UploadOptions) -> list:
    """What is there already (`there`, in parallel) is skipped, the rest returned to do; the
    prefix's other objects are noted; a dry run lists what it would do."""
    with ThreadPoolExecutor(opts.hash_workers) as pool:
        same = list(pool.map(there, items))
    todo = [item for item, s in zip(items, same) if not s]
    report.skipped = [k for k, s in zip(keys, same) if s]
    report.extra = _extra_objects(s3, report.bucket, report.prefix, set(keys))
    if opts.dry_run:
        report.uploaded = [k for k, s in zip(keys, same) if not s]
    return todo


def _extra_objects(s3: Any, bucket: str, prefix: str, keys: set[str]) -> list[str]:
    extra = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        extra += [o["Key"] for o in page.get("Contents", []) if o["Key"] not in keys]
    return extra


# --------------------------------------------------------------------------- from S3

SOURCE_TAG = "kvcache-source"   # object metadata: the source object it was copied from


@dataclass(frozen=True)
class S3Object:
    key: str        # the source key
    dest: str       # the key under the endpoint's prefix
    size: int
    etag: str

    @property
    def tag(self) -> str:
        return f"{self.key}@{self.etag}"


def parse_s3_source(source: str) -> tuple[str, str] | None:
    """`s3://BUCKET/PREFIX` as (bucket, prefix); None for anything else."""
    if not source.startswith("s3://"):
        return None
    bucket, _, prefix = source[5:].partition("/")
    prefix = prefix.strip("/")
    if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", bucket) or not prefix:
        raise ToolError.bad_input("model", source, "s3://BUCKET/PREFIX (a model directory's "
                                  "objects under PREFIX/)")
    return bucket, prefix


def scan_s3_model(s3: Any, bucket: str, src_prefix: str, prefix: str) -> list[S3Object]:
    """The source's objects (hidden path parts left out, as for a directory), or a ToolError
    naming what a model directory lacks."""
    objects = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                              Prefix=src_prefix + "/"):
        for o in page.get("Contents", []):
            rel = o["Key"][len(src_prefix) + 1:]
            if not rel or rel.endswith("/") or any(p.startswith(".") for p in rel.split("/")):
                continue
            objects.append(S3Object(o["Key"], f"{prefix}/{rel}", o["Size"], o["ETag"].strip('"')))
    top = {o.dest.rsplit("/", 1)[1] for o in objects if o.dest.count("/") == prefix.count("/") + 1}
    where = f"s3://{bucket}/{src_prefix}"
    if not any(Path(n).match(WEIGHTS) for n in top):
        raise ToolError.bad_input("model", where, f"a model prefix with {WEIGHTS} weights at "
                                  "its top level")
    for name in REQUIRED:
        if name not in top:
            raise ToolError.bad_input("model", where, f"a model prefix with {name} at its top "
                                      "level")
    return sorted(objects, key=lambda o: o.key)


def _copied(s3: Any, bucket: str, obj: S3Object) -> bool:
    """Whether `obj` was copied to its destination already (same size, same source tag)."""
    from botocore.exceptions import ClientError

    try:
        head = s3.head_object(Bucket=bucket, Key=obj.dest)
    except ClientError as err:
        if error_code(err) in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    return head["ContentLength"] == obj.size and head.get("Metadata", {}).get(SOURCE_TAG) == \
        obj.tag


def copy_model(s3: Any, src_bucket: str, objects: list[S3Object], bucket: str, prefix: str,
               opts: UploadOptions = UploadOptions(), *, show_progress: bool = True
               ) -> UploadReport:
    """Plan (skip what was copied from the same source objects), copy the rest inside S3 with
    the transfer manager (multipart copies for large objects, S3 computing SHA-256 checksums),
    then check every destination object."""
    from boto3.s3.transfer import create_transfer_manager
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    report = UploadReport(bucket, prefix, len(objects), sum(o.size for o in objects))
    todo = _plan(report, s3, [o.dest for o in objects], objects,
                 lambda o: _copied(s3, bucket, o), opts)
    if opts.dry_run:
        return report
    config = transfer_config(opts)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                        console=err_console, disable=not show_progress)
    manager = create_transfer_manager(s3, config)
    with progress:
        task = progress.add_task("copy", total=sum(o.size for o in todo))
        futures = [(o, manager.copy({"Bucket": src_bucket, "Key": o.key}, bucket, o.dest,
                                    extra_args={"ChecksumAlgorithm": CHECKSUM,
                                                "Metadata": {SOURCE_TAG: o.tag},
                                                "MetadataDirective": "REPLACE"},
                                    source_client=s3)) for o in todo]
        try:
            for o, future in futures:
                try:
                    future.result()
                    report.uploaded.append(o.dest)
                except Exception as exc:   # one object's failure must not hide the others'
                    report.failed[o.dest] = f"{type(exc).__name__}: {exc}"
                progress.advance(task, o.size)
        except KeyboardInterrupt:
            manager.shutdown(cancel=True, cancel_msg="interrupted")
            raise ToolError(f"interrupted after {len(report.uploaded)} of {len(todo)} objects; "
                            "run the same command again to resume", exit_code=130) from None
    manager.shutdown()
    for o in objects:
        if o.dest not in report.failed and not _copied(s3, bucket, o):
            report.failed[o.dest] = "not in the bucket as copied from its source after the copy"
    report.verified = len(objects) - len(report.failed)
    return report


def record_s3_config(s3: Any, src_bucket: str, src_prefix: str, prefix: str,
                     dry_run: bool) -> str:
    """record_model_config for a model in S3: its config.json read from the source."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        s3.download_file(src_bucket, f"{src_prefix}/config.json", f"{tmp}/config.json")
        return record_model_config(Path(tmp), prefix, RECORD_ROOT, dry_run)


# --------------------------------------------------------------------------- the model's shape

RECORD_ROOT = ROOT   # the repository whose models/ folder receives the records (tests: a copy)


def record_model_config(model_dir: Path, prefix: str, root: Path, dry_run: bool = False) -> str:
    """Copy the model's config.json to `models/<prefix>/config.json` in the repository, where
    synth reads the shape of the model an endpoint with that modelLocation serves
    (config/models.py RECORDED): a file the team commits. Only a config.json synth can read
    is recorded; for another the line says why, and the upload goes on (only an L2 verdict
    needs the shape, and kvCacheSpec.modelShape can state it). Returns the line to print."""
    rel = RECORDED.format(location=prefix)
    source = model_dir / "config.json"   # a symlink into the Hub's cache is fine: it is ours
    try:
        data = source.read_bytes()[:MAX_FILE_BYTES + 1]
        if len(data) > MAX_FILE_BYTES:
            raise ValueError(f"a config.json of at most {MAX_FILE_BYTES >> 20} MiB")
        text = data.decode("utf-8")
        shape = shape_from_config_json(prefix, load_json_object("-", "config.json", text), rel)
    except ConfigError as err:
        return f"{rel}: not recorded: {source}: {err.value!r}: {err.allowed}"
    except (OSError, ValueError) as err:   # UnicodeDecodeError is a ValueError
        return (f"{rel}: not recorded: {source}: {err} (an L2 verdict needs the model's "
                "shape: state it with kvCacheSpec.modelShape)")
    what = (f"{shape.layers} layers, {shape.kv_bytes_per_token / 1024:g} KiB of KV per token, "
            f"{shape.params / 1e9:.1f}B parameters")
    if dry_run:
        return f"{rel}: would record the model's config.json ({what})"
    dest = root / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text, encoding="utf-8")
    return (f"{rel}: recorded the model's config.json ({what}): commit it; synth judges "
            f"endpoints with modelLocation {prefix} by it")


# --------------------------------------------------------------------------- command


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "upload-model", main, "copy a model (a local directory, ModelScope, "
                    "Hugging Face or S3) to the model bucket", __doc__)
    p.add_argument("model_dir", metavar="MODEL", help="local directory (*.safetensors, "
                   "config.json, tokenizer files), modelscope:ORG/NAME, hf:ORG/NAME or "
                   "s3://BUCKET/PREFIX (copied inside S3)")
    p.add_argument("--revision", help="with a hub model: the tag or commit to take (a commit "
                   "on the Hugging Face Hub)")
    p.add_argument("--include", nargs="+", default=(), metavar="GLOB",
                   help="with a hub model: only the files these patterns match")
    p.add_argument("--sha256", action="append", default=[], metavar="PATH=HEX",
                   help="with a hub model: the sha256 a file must have (repeatable)")
    p.add_argument("--hashes", type=Path, metavar="FILE",
                   help="with a hub model: sha256sum-style lines (HEX  PATH) to check")
    p.add_argument("--hf-token-secret", metavar="SECRET", help="Secrets Manager secret "
                   "holding the Hugging Face token (default: $HF_TOKEN)")
    p.add_argument("--hub-endpoint", metavar="URL", help="the hub's API (a mirror, or "
                   "ModelScope's international site)")
    p.add_argument("--download-dir", default="~/.cache/kvcache-eks/models",
                   help="where hub models are downloaded and kept (resume)")
    p.add_argument("--rate", type=parse_rate, metavar="RATE",
                   help="with --dry-run: the time the transfer takes at RATE (50MB/s)")
    p.add_argument("--endpoint", metavar="NAME",
                   help="endpoint whose modelLocation receives the files (needed when the "
                   "environment serves more than one)")
    p.add_argument("--prefix", help="S3 key prefix instead of the endpoint's modelLocation")
    p.add_argument("--bucket", help="bucket instead of the Storage stack's ModelBucketName")
    p.add_argument("--chunk-mib", type=int, default=64, help="multipart part size (default 64)")
    p.add_argument("--concurrency", type=int, default=10, help="parallel requests (default 10)")
    p.add_argument("--dry-run", action="store_true", help="show what would be uploaded")


def main(args: argparse.Namespace, aws: Aws | None = None) -> int:
    cfg = load_environment(args)
    if not 5 <= args.chunk_mib <= 5 * 1024:
        raise ToolError.bad_input("--chunk-mib", args.chunk_mib, "5 to 5120 (S3 part sizes)")
    if not 1 <= args.concurrency <= 64:
        raise ToolError.bad_input("--concurrency", args.concurrency, "1 to 64")
    if args.prefix:
        prefix = check_prefix(args.prefix)
    else:
        prefix = pick_endpoint(cfg, load_endpoints(cfg), args.endpoint).model_location
    source = str(args.model_dir)
    if (s3_source := parse_s3_source(source)) is not None:
        return main_s3(args, cfg, s3_source, prefix, aws)
    hub = HubModel.parse(source, getattr(args, "revision", None), getattr(
        args, "hub_endpoint", None), getattr(args, "include", ()))
    if hub is not None:
        model_dir, aws = fetch_hub_model(args, cfg, hub, prefix, aws)
        if model_dir is None:
            return 0
    else:
        model_dir = Path(source)
        if any(getattr(args, a, None) for a in ("revision", "sha256", "hashes", "include")):
            raise ToolError.bad_input("--revision/--sha256/--hashes/--include", source,
                                      "modelscope:ORG/NAME or hf:ORG/NAME (a hub model)")
    files = scan_model_dir(model_dir, prefix)
    out_console.print(record_model_config(model_dir, prefix, RECORD_ROOT, args.dry_run))
    if args.dry_run:
        total = sum(f.size for f in files)
        out_console.print(f"{model_dir}: {len(files)} files, {human_size(total)}" + (
            f", upload {transfer_estimate(total, args.rate)}" if getattr(args, "rate", None)
            else ""))
    aws = aws or Aws(cfg, args.profile)
    try:
        bucket = args.bucket or aws.stack_output("Storage", "ModelBucketName")
        s3 = aws.client("s3")
        check_bucket(s3, bucket, cfg.region)
    except Exception as err:   # a dry run lists the files without credentials
        from botocore.exceptions import NoCredentialsError

        if not (args.dry_run and isinstance(err, NoCredentialsError)):
            raise
        for f in files:
            out_console.print(f"  {human_size(f.size):>10}  {f.key}")
        out_console.print("no AWS credentials: not compared with what the bucket holds")
        return 0
    report = upload_model(s3, files, bucket, prefix, UploadOptions(
        chunk_mib=args.chunk_mib, concurrency=args.concurrency, dry_run=args.dry_run))
    return print_report(report, args.dry_run)


def main_s3(args: argparse.Namespace, cfg: Any, source: tuple[str, str], prefix: str,
            aws: Aws | None) -> int:
    """upload-model from `s3://BUCKET/PREFIX`: a copy inside S3 (the account's credentials)."""
    from botocore.exceptions import NoCredentialsError

    if any(getattr(args, a, None) for a in ("revision", "sha256", "hashes", "include")):
        raise ToolError.bad_input("--revision/--sha256/--hashes/--include", args.model_dir,
                                  "modelscope:ORG/NAME or hf:ORG/NAME (a hub model)")
    src_bucket, src_prefix = source
    aws = aws or Aws(cfg, args.profile)
    try:
        bucket = args.bucket or aws.stack_output("Storage", "ModelBucketName")
        s3 = aws.client("s3")
        check_bucket(s3, bucket, cfg.region)
        objects = scan_s3_model(s3, src_bucket, src_prefix, prefix)
    except NoCredentialsError:
        raise ToolError(f"{args.model_dir}: an S3 source is read with the account's "
                        "credentials, also for --dry-run (none found)") from None
    out_console.print(record_s3_config(s3, src_bucket, src_prefix, prefix, args.dry_run))
    report = copy_model(s3, src_bucket, objects, bucket, prefix, UploadOptions(
        chunk_mib=args.chunk_mib, concurrency=args.concurrency, dry_run=args.dry_run))
    return print_report(report, args.dry_run, verb="copied", what="source tag")


def fetch_hub_model(args: argparse.Namespace, cfg: Any, hub: "HubModel", prefix: str,
                    aws: Aws | None) -> tuple[Path | None, Aws | None]:
    """Lists the hub model's files (a dry run stops there, with no AWS at all), downloads
    them into the kept download directory and checks them; returns that directory."""
    from tools.hub import HUBS, parse_hashes, verify

    if hub.hub == "hf" and cfg.facts.china:
        raise ToolError.bad_input("model", str(args.model_dir), "modelscope:ORG/NAME or a local "
                                  f"directory in {cfg.region} (the Hugging Face Hub is not "
                                  "reachable from AWS China)")
    given = parse_hashes(args.sha256, args.hashes)
    token = None
    if hub.hub == "hf" and not args.dry_run and args.hf_token_secret:
        aws = aws or Aws(cfg, args.profile)
        token = hf_token(args.hf_token_secret, aws.client)
    elif hub.hub == "hf":
        token = hf_token(None, None)
    listed = hub.files(token)
    if not listed:
        raise ToolError.bad_input("model", hub.name, "a revision with files (--include picks "
                                  "none?)")
    total = sum(f.size for f in listed)
    if args.dry_run:
        for f in listed:
            out_console.print(f"  {human_size(f.size):>10}  {f.path}"
                              + (f"  sha256 {f.sha256[:12]}" if f.sha256 else ""))
        out_console.print(f"{hub.name} ({HUBS[hub.hub]}) -> s3://<model bucket>/{prefix}/: "
                          f"{len(listed)} files, {human_size(total)}"
                          + (f", download {transfer_estimate(total, args.rate)}"
                             if args.rate else ""))
        unknown = set(given) - {f.path for f in listed}
        if unknown:
            raise ToolError.bad_input("--sha256", sorted(unknown)[0],
                                      [f.path for f in listed])
        return None, aws
    dest = (Path(args.download_dir).expanduser() / hub.hub / hub.repo / hub.revision)
    err_console.print(f"{hub.name}: {len(listed)} files, {human_size(total)} into {dest}")
    hub.download(dest, token)
    hashed = verify(dest, listed, given)
    err_console.print(f"{hub.name}: {len(listed)} files as listed, {hashed} checked by sha256")
    return dest, aws


def print_report(report: UploadReport, dry_run: bool = False, verb: str = "uploaded",
                 what: str = "SHA-256") -> int:
    """The summary line (`verb`: uploaded or copied; `what` the verification used)."""
    where = f"s3://{report.bucket}/{report.prefix}/"
    gib = report.bytes_total / 1024**3
    action = {"uploaded": "upload", "copied": "copy"}[verb]
    if dry_run:
        out_console.print(f"{where}: {len(report.uploaded)} of {report.files} files to "
                          f"{action}, {len(report.skipped)} already there")
        for key in report.uploaded:
            out_console.print(f"  {action} {key}")
    else:
        out_console.print(f"{where}: {report.files} files ({gib:.2f} GiB): "
                          f"{len(report.uploaded)} {verb}, {len(report.skipped)} already there, "
                          f"{report.verified} verified ({what})")
    for key in report.extra:
        err_console.print(f"warning: s3://{report.bucket}/{key} is not in the model directory "
                          "(a stale file? workers sync the whole prefix)")
    if report.failed:
        first = next(iter(report.failed.items()))
        raise ToolError(f"{len(report.failed)} of {report.files} files not {verb} "
                        f"({first[0]}: {first[1]}); run the same command again to resume")
    return 0
