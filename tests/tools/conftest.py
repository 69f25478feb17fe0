"""Shared fixtures for the operator tools: fake AWS credentials so nothing reaches AWS."""
from __future__ import annotations

import functools

import pytest


class _SearchPaths(list):
    """boto3 appends its data folder to the loader of every Session it makes: once is enough."""

    def append(self, path) -> None:
        if path not in self:
            super().append(path)


@functools.cache
def _shared_loader(search_path_string=None):
    from botocore import loaders
    loader = loaders.create_loader(search_path_string)
    loader._search_paths = _SearchPaths(loader.search_paths)
    return loader


@pytest.fixture(scope="session", autouse=True)
def _one_botocore_loader():
    """botocore parses a service's JSON model once per Session (S3's: ~0.3 s), and the tools
    and these tests make a fresh Session for nearly every client: here they share one loader,
    so each model is parsed once per run. The parsed models are read-only to botocore (one
    Session already hands the same ones to all its clients)."""
    import botocore.session
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(botocore.session, "create_loader", _shared_loader)
        yield


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials that only moto or a Stubber will ever see."""
    for key in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")


@pytest.fixture(autouse=True)
def _model_records_in_a_copy(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """upload-model records a model's config.json in the repository: here, in a scratch one."""
    from tools import upload_model
    monkeypatch.setattr(upload_model, "RECORD_ROOT", tmp_path / "repository")
