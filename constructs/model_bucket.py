"""The S3 bucket that holds model weights: the only place workers load models from."""
from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Duration, RemovalPolicy, aws_kms as kms, aws_s3 as s3
from constructs import Construct


@dataclass(frozen=True)
class ModelBucketProps:
    kms_encryption: bool
    removal_policy: RemovalPolicy


class ModelBucket(Construct):
    """Encrypted, versioned, TLS-only, access-logged, private; retained unless told otherwise."""

    def __init__(self, scope: Construct, id: str, *, props: ModelBucketProps) -> None:
        super().__init__(scope, id)
        destroy = props.removal_policy == RemovalPolicy.DESTROY
        self.access_logs = s3.Bucket(
            self, "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,  # log delivery cannot write SSE-KMS
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_PREFERRED,
            lifecycle_rules=[s3.LifecycleRule(expiration=Duration.days(365))],
            removal_policy=props.removal_policy, auto_delete_objects=destroy,
        )
        self.key = (kms.Key(self, "Key", enable_key_rotation=True,
                            removal_policy=props.removal_policy,
                            description="Model weights bucket encryption")
                    if props.kms_encryption else None)
        self.bucket = s3.Bucket(
            self, "Bucket",
            encryption=s3.BucketEncryption.KMS if self.key else s3.BucketEncryption.S3_MANAGED,
            encryption_key=self.key,
            bucket_key_enabled=bool(self.key),
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            versioned=True,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="model-bucket/",
            lifecycle_rules=[s3.LifecycleRule(
                noncurrent_version_expiration=Duration.days(30),
                abort_incomplete_multipart_upload_after=Duration.days(7),
            )],
            removal_policy=props.removal_policy, auto_delete_objects=destroy,
        )
