"""Shared fixtures for the operator tools: fake AWS credentials so nothing reaches AWS."""
from __future__ import annotations

import pytest


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
