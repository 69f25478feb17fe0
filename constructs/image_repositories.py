"""ECR repositories for every image in the catalogue, named so the mirror tool and the charts
compute the same reference (`<account>.dkr.ecr.<region>.<suffix>/kvcache/<source path>`).

The names are chosen, not generated: manifests written for GitOps must carry concrete image
references, and the mirror runs before the cluster exists.
"""
from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Duration, RemovalPolicy, aws_ecr as ecr
from constructs import Construct
from constructs.naming import logical_id


@dataclass(frozen=True)
class ImageRepositoriesProps:
    repository_names: tuple[str, ...]
    removal_policy: RemovalPolicy
    keep_images: int = 30


class ImageRepositories(Construct):
    """Scan on push, immutable tags, bounded history; retained with the images in them."""

    def __init__(self, scope: Construct, id: str, *, props: ImageRepositoriesProps) -> None:
        super().__init__(scope, id)
        self.repositories: dict[str, ecr.Repository] = {}
        for name in props.repository_names:
            self.repositories[name] = ecr.Repository(
                self, logical_id(name),
                repository_name=name,
                image_scan_on_push=True,
                image_tag_mutability=ecr.TagMutability.IMMUTABLE,
                encryption=ecr.RepositoryEncryption.AES_256,
                lifecycle_rules=[
                    ecr.LifecycleRule(rule_priority=1, tag_status=ecr.TagStatus.UNTAGGED,
                                      max_image_age=Duration.days(14)),
                    ecr.LifecycleRule(rule_priority=2, tag_status=ecr.TagStatus.ANY,
                                      max_image_count=props.keep_images),
                ],
                removal_policy=props.removal_policy,
                empty_on_delete=props.removal_policy == RemovalPolicy.DESTROY,
            )
