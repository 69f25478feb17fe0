from __future__ import annotations

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from config import EnvironmentConfig
from config.images import CHARTS, Image
from constructs.image_repositories import ImageRepositories, ImageRepositoriesProps
from constructs.model_bucket import ModelBucket, ModelBucketProps
from stacks.common import removal_policy


class StorageStack(Stack):
    """State that outlives clusters: model weights and the image mirror."""

    def __init__(self, scope: Construct, id: str, *, cfg: EnvironmentConfig,
                 images: tuple[Image, ...], **kwargs) -> None:
        super().__init__(scope, id, **kwargs)
        models = ModelBucket(self, "Models", props=ModelBucketProps(
            kms_encryption=cfg.bucket_encryption == "kms", removal_policy=removal_policy(cfg)))
        self.model_bucket, self.model_key = models.bucket, models.key
        self.repositories = ImageRepositories(self, "Images", props=ImageRepositoriesProps(
            # what this environment deploys (k8s/serving.py environment_images), and the charts
            repository_names=tuple(sorted({i.mirror_repository for i in images}
                                          | {c.mirror_repository for c in CHARTS.values()})),
            removal_policy=removal_policy(cfg))).repositories
        # ${MODEL_BUCKET} in dist/; the operator tools read it instead of guessing names.
        CfnOutput(self, "ModelBucketName", value=self.model_bucket.bucket_name)
