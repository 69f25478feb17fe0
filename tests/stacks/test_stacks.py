"""What must hold in the synthesized templates, for the global and the China environment."""
from __future__ import annotations

import ipaddress
import json

import pytest

from config.contracts import GPU_TAINT_KEY, NODE_ROLE_GPU, NODE_ROLE_LABEL
from config.images import CHARTS, IMAGES, autoscaler_key
from k8s.cache import SharedCacheChart
from k8s.gateway import joins_gateway
from k8s.certificate import s3_object
from k8s.serving import generated_tls, load_endpoints, reads_managed_l2
from tests.conftest import ENVIRONMENTS, ROOT, dumps, resources
from tests.stacks.cluster_model import flatten



@pytest.fixture(scope="module", params=ENVIRONMENTS)
def synth(request, synths):
    return synths[request.param]


def test_stack_set_follows_the_variant(dev, china):
    """No Cache stack: no shipped endpoint asks for an L2, so nothing is provisioned for one
    (tests/stacks/test_cache_stack.py has the stack where one does)."""
    assert set(dev.templates) == {f"KvCache-dev-{s}" for s in
                                  ("Network", "Storage", "Cluster", "Observability",
                                   "Serving", "Monitoring")}
    assert set(china.templates) == {f"KvCache-china-{s}" for s in
                                    ("Network", "Storage", "Cluster", "Serving",
                                     "Monitoring")}


def test_no_hand_written_aws_partition_anywhere(synth):
    # the ARNs the environment's files give (ACM certificates) are theirs, partition and all
    given = {synth.cfg.listener.certificate_arn, *(s.tls_certificate_arn for s in load_endpoints(
        synth.cfg, ROOT))} - {None}
    for name, template in synth.templates.items():
        text = dumps(template)
        for arn in given:
            text = text.replace(arn, "<given>")
        assert "arn:aws:" not in text, name
        assert "arn:aws-cn:" not in text, name


def test_china_has_no_managed_observability_hyperpod_or_auto_mode(china, synths):
    for s in (china, synths["dev-cn"]):
        text = "".join(dumps(t) for t in s.templates.values())
        for forbidden in ("AWS::APS::", "AWS::Grafana::", "AWS::SageMaker::"):
            assert forbidden not in text
        cluster = next(iter(resources(s.template("Cluster"), "AWS::EKS::Cluster").values()))
        assert cluster["Properties"].get("ComputeConfig", {}).get("Enabled") in (None, False)
        for ng in resources(s.template("Cluster"), "AWS::EKS::Nodegroup").values():
            assert "NodeRepairConfig" not in ng["Properties"]


def test_global_has_amp_and_grafana(dev):
    t = dev.template("Observability")
    assert len(resources(t, "AWS::APS::Workspace")) == 1
    (ws,) = resources(t, "AWS::Grafana::Workspace").values()
    assert ws["Properties"]["DataSources"] == ["PROMETHEUS"]


def test_network(synth):
    net = synth.cfg.network
    if net.existing:   # nothing is created in a VPC the team already has
        assert all(not resources(t, "AWS::EC2::VPC") and not resources(t, "AWS::EC2::Subnet")
                   for t in synth.templates.values())
        (cluster,) = resources(synth.template("Cluster"), "AWS::EKS::Cluster").values()
        assert cluster["Properties"]["ResourcesVpcConfig"]["SubnetIds"] == [
            s.subnet_id for s in net.private_subnets]
        return
    t = synth.template("Network")
    (vpc,) = resources(t, "AWS::EC2::VPC").values()
    assert vpc["Properties"]["CidrBlock"] == net.vpc_cidr
    subnets = resources(t, "AWS::EC2::Subnet").values()
    assert len(subnets) == 2 * len(synth.cfg.availability_zones)
    assert {s["Properties"]["AvailabilityZone"] for s in subnets} == set(
        synth.cfg.availability_zones)
    assert len(resources(t, "AWS::EC2::NatGateway")) == synth.cfg.nat_gateways
    assert len(resources(t, "AWS::EC2::FlowLog")) == 1
    endpoints = resources(t, "AWS::EC2::VPCEndpoint").values()
    gateway = [e for e in endpoints if e["Properties"].get("VpcEndpointType") != "Interface"]
    assert len(gateway) == 1 and "s3" in dumps(gateway[0]["Properties"]["ServiceName"])
    names = dumps([e["Properties"]["ServiceName"] for e in endpoints])
    for service in ("ecr.api", "ecr.dkr", "sts", "logs", "secretsmanager"):
        assert f".{service}" in names, service
    if synth.cfg.facts.china:
        assert "cn.com.amazonaws" in names  # China ECR endpoint service names


def test_model_bucket_is_encrypted_private_tls_only_versioned_logged_and_retained(synth):
    t = synth.template("Storage")
    buckets = resources(t, "AWS::S3::Bucket")
    (model,) = [b for b in buckets.values() if "VersioningConfiguration" in b["Properties"]]
    p = model["Properties"]
    assert p["VersioningConfiguration"] == {"Status": "Enabled"}
    assert p["BucketEncryption"]["ServerSideEncryptionConfiguration"][0][
        "ServerSideEncryptionByDefault"]["SSEAlgorithm"] == (
            "aws:kms" if synth.cfg.bucket_encryption == "kms" else "AES256")
    assert all(p["PublicAccessBlockConfiguration"][k] for k in (
        "BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets"))
    assert "LoggingConfiguration" in p
    kept = "Retain" if synth.cfg.retain_data else "Delete"   # removalPolicy
    for bucket in buckets.values():
        assert bucket["DeletionPolicy"] == kept and bucket["UpdateReplacePolicy"] == kept
    policies = dumps(resources(t, "AWS::S3::BucketPolicy"))
    assert '"aws:SecureTransport": "false"' in policies


def test_ecr_repository_per_image_the_environment_deploys(synth):
    from k8s.serving import environment_images
    repos = resources(synth.template("Storage"), "AWS::ECR::Repository").values()
    names = {r["Properties"]["RepositoryName"] for r in repos}
    assert names == {i.mirror_repository for i in environment_images(
        synth.cfg, load_endpoints(synth.cfg, ROOT))} | {
        c.mirror_repository for c in CHARTS.values()}
    assert "kvcache/router" in names    # built by the mirror, pulled from here everywhere
    # the router's base (inside the router image) gets none; lmcache/vllm-openai one, whichever
    # tag a file names (the sample's v0.3.7 too)
    assert IMAGES["python"].mirror_repository not in names
    lmcache = IMAGES["vllm-lmcache"]
    assert (lmcache.mirror_repository in names) is any(
        s.image.source == lmcache.source for s in load_endpoints(synth.cfg, ROOT))
    for r in repos:
        p = r["Properties"]
        assert p["ImageScanningConfiguration"] == {"ScanOnPush": True}
        assert p["ImageTagMutability"] == "IMMUTABLE"
        assert "LifecyclePolicy" in p and r["DeletionPolicy"] == (
            "Retain" if synth.cfg.retain_data else "Delete")


def test_stateful_logical_ids_are_stable(dev):
    """Renaming these would replace the resource (and lose data): change them on purpose only."""
    assert "ModelsBucket970C6ADA" in dev.template("Storage")["Resources"]
    # the L2's replication group: tests/stacks/test_cache_stack.py


def test_cluster(synth):
    t = synth.template("Cluster")
    (cluster,) = resources(t, "AWS::EKS::Cluster").values()
    p = cluster["Properties"]
    assert p["Version"] == synth.cfg.kubernetes_version
    assert p["EncryptionConfig"][0]["Resources"] == ["secrets"]
    assert len(p["Logging"]["ClusterLogging"]["EnabledTypes"]) == 5
    access = p["ResourcesVpcConfig"]
    assert access["EndpointPrivateAccess"] is True
    if synth.cfg.cluster_endpoint.public:
        assert access["EndpointPublicAccess"] is True
        assert access["PublicAccessCidrs"] == list(synth.cfg.cluster_endpoint.public_cidrs)
    else:
        assert access["EndpointPublicAccess"] is False


def test_node_groups(synth):
    t = synth.template("Cluster")
    groups = resources(t, "AWS::EKS::Nodegroup").values()
    gpu = [g["Properties"] for g in groups if g["Properties"]["Labels"].get(
        NODE_ROLE_LABEL) == NODE_ROLE_GPU]
    assert len(gpu) == len(synth.cfg.gpu_node_groups)
    for props, want in zip(sorted(gpu, key=lambda g: g["Labels"]["kvcache.io/node-group"]),
                           sorted(synth.cfg.gpu_node_groups, key=lambda g: g.name)):
        assert props["AmiType"].upper() == want.ami_type and props["AmiType"].endswith("NVIDIA")
        assert props["Taints"] == [{"Effect": "NO_SCHEDULE", "Key": GPU_TAINT_KEY,
                                    "Value": "present"}]
        assert props["InstanceTypes"] == list(want.instance_types)
        assert props["ScalingConfig"] == {"MinSize": want.min_size, "MaxSize": want.max_size,
                                          "DesiredSize": want.desired_size}
    system = [g["Properties"] for g in groups if not g["Properties"].get("Taints")]
    assert len(system) == 1
    for template in resources(t, "AWS::EC2::LaunchTemplate").values():
        data = template["Properties"]["LaunchTemplateData"]
        assert data["MetadataOptions"]["HttpTokens"] == "required"
        # no pod reaches the node role through IMDS
        assert data["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
        assert data["BlockDeviceMappings"][0]["Ebs"]["Encrypted"] is True
    subnets = dumps([g["Properties"]["Subnets"] for g in groups])
    assert "public" not in subnets.lower()  # imports of private subnets only


def test_every_node_group_runs_the_clusters_kubernetes_version(synth):
    """Version on every managed node group, in every stack, is the cluster's: a bump of
    kubernetesVersion rolls the nodes instead of leaving them behind the control plane (issue
    29, finding 3); ReleaseVersion is the environment's pinned AMI release, or none (the
    latest of that version)."""
    (cluster,) = resources(synth.template("Cluster"), "AWS::EKS::Cluster").values()
    version = cluster["Properties"]["Version"]
    assert version == synth.cfg.kubernetes_version
    groups = [g["Properties"] for t in synth.templates.values()
              for g in resources(t, "AWS::EKS::Nodegroup").values()]
    assert len(groups) >= 1 + len(synth.cfg.gpu_node_groups)
    for props in groups:
        assert props["Version"] == version, props["Labels"]
        assert props.get("ReleaseVersion") == synth.cfg.ami_release_version
    # the launch templates name no AMI: EKS refuses Version with a custom one
    for t in synth.templates.values():
        for template in resources(t, "AWS::EC2::LaunchTemplate").values():
            assert "ImageId" not in template["Properties"]["LaunchTemplateData"]


def test_addons_and_pod_identity(synth):
    t = synth.template("Cluster")
    names = {a["Properties"]["AddonName"] for a in resources(t, "AWS::EKS::Addon").values()}
    assert {"vpc-cni", "kube-proxy", "coredns", "eks-pod-identity-agent",
            "aws-ebs-csi-driver"} <= names
    assert len(resources(t, "AWS::EKS::PodIdentityAssociation")) >= 1
    addons = {a["Properties"]["AddonName"]: (k, a) for k, a in resources(t, "AWS::EKS::Addon").items()}
    cni_id, cni = addons["vpc-cni"]
    # NetworkPolicy enforced (both partitions), CNI permissions on aws-node, not the node role
    assert json.loads(cni["Properties"]["ConfigurationValues"]) == {"enableNetworkPolicy": "true"}
    (assoc,) = cni["Properties"]["PodIdentityAssociations"]
    assert assoc["ServiceAccount"] == "aws-node"
    roles = resources(t, "AWS::IAM::Role")
    cni_role = roles[assoc["RoleArn"]["Fn::GetAtt"][0]]
    assert "AmazonEKS_CNI_Policy" in dumps(cni_role["Properties"]["ManagedPolicyArns"])
    assert "pods.eks.amazonaws.com" in dumps(cni_role["Properties"]["AssumeRolePolicyDocument"])
    node_roles = [r for r in roles.values() if "ec2.amazonaws.com" in dumps(
        r["Properties"]["AssumeRolePolicyDocument"])]
    assert node_roles and all("AmazonEKS_CNI_Policy" not in dumps(r) for r in node_roles)
    for group in resources(t, "AWS::EKS::Nodegroup").values():
        assert cni_id in group.get("DependsOn", [])  # aws-node has its identity first
    assert len(resources(t, "AWS::EKS::AccessEntry")) >= len(synth.cfg.admin_role_names)


def test_alb_controller_image_comes_from_the_region_addon_registry(synth):
    text = dumps(synth.template("Cluster"))
    assert synth.cfg.facts.eks_addon_registry + "/amazon/aws-load-balancer-controller" in text
    if synth.cfg.facts.china:
        assert "us-west-2" not in text


def test_load_balancer_subnets_hold_no_pod(synth):
    """The NetworkPolicy ipBlocks admitting the NLB (cfg.network.load_balancer_cidrs) cover the
    subnets the router NLBs sit in, and no subnet where nodes and pods live; in a private-only
    VPC they are the NLBs' own fixed addresses alone."""
    net = synth.cfg.network
    lb = [ipaddress.ip_network(c) for c in net.load_balancer_cidrs]
    blocks = [p["ipBlock"]["cidr"] for c in synth.stacks.serving.charts for d in c.to_json()
              if d["kind"] == "NetworkPolicy" for rule in d["spec"].get("ingress", [])
              for p in rule["from"] if "ipBlock" in p]
    if net.private_only:
        # no subnet without pods: each NLB is admitted by the fixed addresses it holds alone,
        # inside the node subnets' blocks set aside for them (config/network.py)
        fixed = {f"{a}/32" for c in synth.stacks.serving.charts for d in c.to_json()
                 if d["kind"] == "Service" for k, v in d["metadata"].get(
                     "annotations", {}).items()
                 if k.endswith("aws-load-balancer-private-ipv4-addresses")
                 for a in v.split(",")}
        assert blocks and set(blocks) == fixed
        assert all(any(ipaddress.ip_network(b).subnet_of(n) for n in lb) for b in blocks)
        return
    if net.existing:
        public = [ipaddress.ip_network(s.cidr) for s in net.load_balancer_subnets]
        private = [ipaddress.ip_network(s.cidr) for s in net.private_subnets]
    else:
        subnets = resources(synth.template("Network"), "AWS::EC2::Subnet").values()
        public = [ipaddress.ip_network(s["Properties"]["CidrBlock"]) for s in subnets
                  if s["Properties"]["MapPublicIpOnLaunch"]]
        private = [ipaddress.ip_network(s["Properties"]["CidrBlock"]) for s in subnets
                   if not s["Properties"]["MapPublicIpOnLaunch"]]
    assert public and private
    assert all(any(n.subnet_of(b) for b in lb) for n in public)
    assert not any(n.overlaps(b) for n in private for b in lb)
    serving = synth.template("Serving")
    assert "aws-load-balancer-subnets" in dumps(serving)
    if not net.existing:
        assert "publicSubnet" in dumps(serving)
    # the serving namespace admits the NLB by exactly these ranges, on the router port only
    assert blocks and set(blocks) == set(net.load_balancer_cidrs)


def test_tags_applied(synth):
    t = synth.template("Storage")
    tags = json.dumps(t)
    for key, value in synth.cfg.tags.items():
        assert f'"Key": "{key}", "Value": "{value}"' in tags


def test_serving_stack_applies_every_chart_and_grants_read_only_model_access(synth):
    t = synth.template("Serving")
    manifests = [m for m in t["Resources"].values() if m["Type"] == "Custom::AWSCDK-EKS-KubernetesResource"]
    # every chart: the namespace, the in-cluster cache where an endpoint's L2 is there, each
    # endpoint's workers and router, the inference gateway's CRD and per-endpoint chart where
    # endpoints join one (k8s/gateway.py), the NetworkPolicies
    charts = synth.stacks.serving.charts
    specs = load_endpoints(synth.cfg, ROOT)
    joining = sum(joins_gateway(synth.cfg, s) for s in specs)
    assert len(manifests) == len(charts) == 2 + 2 * len(synth.cfg.endpoint_files) + sum(
        isinstance(c, SharedCacheChart) for c in charts) + joining + (
        1 if joining and synth.cfg.inference_gateway.install_crd else 0)
    policies = dumps(resources(t, "AWS::IAM::Policy"))
    assert "s3:DeleteObject" not in policies
    # the only write: each front certificate's public part, to the one object its file names
    certs = {s3_object(uri, s.name).removeprefix("s3://") for s in specs
             if (uri := generated_tls(synth.cfg, s).get("certificate_s3_uri"))}
    statements = [st for pol in resources(t, "AWS::IAM::Policy").values()
                  for st in pol["Properties"]["PolicyDocument"]["Statement"]]
    writes = [st for st in statements if "s3:PutObject" in _listify(st["Action"])]
    assert all(_listify(st["Action"]) == ["s3:PutObject"] for st in writes)
    assert sorted(flatten(st["Resource"]).split(":s3:::", 1)[1] for st in writes) == sorted(certs)
    prefixes = {f"{s.model_location}/*" for s in specs}
    s3 = [st for st in statements if st not in writes
          and any(a.startswith("s3:") for a in _listify(st["Action"]))]
    # least privilege: objects under each endpoint's own prefix, and listing only with the
    # s3:prefix condition
    assert {a for st in s3 for a in _listify(st["Action"])} == {"s3:GetObject", "s3:ListBucket"}
    listed, read = set(), set()
    for st in s3:
        if st["Action"] == "s3:ListBucket":
            listed.update(st["Condition"]["StringLike"]["s3:prefix"])
        else:
            (prefix,) = [p for p in prefixes if f'"/{p}"' in dumps(st["Resource"])]
            read.add(prefix)
    assert listed == read == prefixes
    # Only the workers of an endpoint whose L2 is the environment's ElastiCache may read its
    # AUTH token (none where no endpoint's L2 is there).
    readers = {s.name for s in specs if reads_managed_l2(synth.cfg, s)}
    token = [pol for pol in resources(t, "AWS::IAM::Policy").values()
             if "L2AuthToken" in dumps(pol["Properties"]["PolicyDocument"])]
    assert len(token) == len(readers)
    text = dumps(t)
    assert "resolve:secretsmanager" not in text  # workers fetch it at start, never a manifest
    # a worker and a router identity per endpoint; both may read the API key, nothing else
    assert len(resources(t, "AWS::EKS::PodIdentityAssociation")) == 2 * len(
        synth.cfg.endpoint_files) + len(certs)   # and the certificate Job's, where it writes
    assert "resolve:secretsmanager" not in text and "ApiKeySecretArn" in t["Outputs"]


def _listify(value) -> list:
    return value if isinstance(value, list) else [value]


def _helm(template: dict) -> dict[str, dict]:
    return {r["Properties"]["Release"]: r["Properties"] for r in template["Resources"].values()
            if r["Type"] == "Custom::AWSCDK-EKS-HelmChart"}


def test_keda_and_cluster_autoscaler_are_pinned_and_pull_what_the_region_can_reach(synth):
    charts = _helm(synth.template("Cluster"))
    keda, ca = charts["keda"], charts["cluster-autoscaler"]
    assert keda["Version"] == "2.20.2" and ca["Version"] == "9.54.0"
    values = dumps(keda["Values"]) + dumps(ca["Values"])
    if synth.cfg.use_ecr_images:   # China always; a global region where the file says so
        registry = f"{synth.cfg.account}.{synth.cfg.facts.ecr_host_suffix}"
        assert dumps(keda["Repository"]).startswith(f'"oci://{registry}/kvcache/charts/keda')
        for upstream in ("ghcr.io", "registry.k8s.io", "docker.io"):
            assert upstream not in values
        assert registry in values
    else:
        assert keda["Repository"] == "https://kedacore.github.io/charts"
    # three KEDA images, and the autoscaler of the cluster's minor where its digest is known
    # (config/images.py AUTOSCALER: synth warns for one pinned by tag only)
    autoscaler = IMAGES[autoscaler_key(synth.cfg.kubernetes_version)]
    assert values.count("@sha256:") == 3 + bool(autoscaler.digest)
    assert (f"{autoscaler.tag}@{autoscaler.digest}" if autoscaler.digest
            else autoscaler.tag) in values


def test_scaling_identities(synth):
    t = synth.template("Cluster")
    sas = {a["Properties"]["ServiceAccount"]
           for a in resources(t, "AWS::EKS::PodIdentityAssociation").values()}
    assert {"keda-operator", "cluster-autoscaler", "ebs-csi-controller-sa"} <= sas
    policies = dumps(resources(t, "AWS::IAM::Policy"))
    assert "autoscaling:SetDesiredCapacity" in policies
    assert "aws:ResourceTag/k8s.io/cluster-autoscaler/" in dumps(t)
    assert ("aps:QueryMetrics" in policies) is (synth.cfg.observability == "managed")


def test_every_image_is_pinned_by_digest_but_the_documented_one(dev):
    from config.images import unpinned_images
    # No public record ties a digest to lmcache/vllm-openai:v0.5.4 (see config/images.py),
    # nor to the Cluster Autoscaler images of the Kubernetes minors the samples do not run,
    # and the router image's is printed by its first build (`tools mirror --resolve --only
    # router`: no registry here reaches its base); any other image without one fails here.
    # The EFA device plugin's and the endpoint picker's (k8s/gateway.py) could not be read
    # where they were added: the mirror resolves and prints them.
    assert sorted(i.key for i in unpinned_images()) == [
        "cluster-autoscaler-1.33", "cluster-autoscaler-1.34", "cluster-autoscaler-1.36",
        "efa-device-plugin", "epp", "router", "vllm-lmcache"]
    for image in IMAGES.values():
        assert image.tag != "latest"
        assert image.digest is None or (image.digest.startswith("sha256:")
                                        and len(image.digest) == 71), image.key
    warnings = [str(m.data) for m in dev.stacks.serving.node.metadata
                if m.type == "aws:cdk:warning" and "has no digest" in str(m.data)]
    # The router's (dev does not deploy v0.5.4), and the shipped file's v0.3.7.
    assert len(warnings) == 2 and any("lmcache/vllm-openai:v0.3.7 has no digest" in w
                                      for w in warnings)
    assert any(w.startswith("kvcache-eks/router:") for w in warnings), warnings


def test_alb_controller_chart_comes_from_where_the_region_can_reach(synth):
    alb = _helm(synth.template("Cluster"))["aws-load-balancer-controller"]
    assert alb["Version"] == CHARTS["aws-load-balancer-controller"].version
    if synth.cfg.use_ecr_images:   # China always; a global region where the file says so
        registry = f"{synth.cfg.account}.{synth.cfg.facts.ecr_host_suffix}"
        assert alb["Repository"] == (f"oci://{registry}/kvcache/charts/"
                                     "aws-load-balancer-controller")
    else:
        assert alb["Repository"] == "https://aws.github.io/eks-charts"


@pytest.mark.parametrize("uri", ["s3://team-certs/kvcache", "s3://team-certs/a/b/front.pem"])
def test_the_certificate_job_may_write_its_object_under_the_buckets_own_kms_key(uri):
    """SSE-KMS by default on the team's bucket: the writer needs kms:GenerateDataKey of a key
    the stack does not know; the grant holds to S3 and that object (or its bucket, with S3
    Bucket Keys), nothing else."""
    import aws_cdk as cdk
    from aws_cdk import aws_iam as iam

    from stacks.serving_stack import cert_object

    stack = cdk.Stack(cdk.App(), "Grants", env=cdk.Environment(region="cn-north-1"))
    role = iam.Role(stack, "Cert", assumed_by=iam.ServicePrincipal("pods.eks.amazonaws.com"))
    obj = s3_object(uri, "chat").removeprefix("s3://")
    cert_object(role, s3_object(uri, "chat"))
    template = stack.resolve(cdk.assertions.Template.from_stack(stack).to_json())
    (policy,) = resources(template, "AWS::IAM::Policy").values()
    put, data_key = policy["Properties"]["PolicyDocument"]["Statement"]
    assert (put["Action"], flatten(put["Resource"]).split(":s3:::", 1)[1]) == ("s3:PutObject", obj)
    assert data_key["Action"] == "kms:GenerateDataKey" and data_key["Resource"] == "*"
    via = flatten(data_key["Condition"]["StringEquals"]["kms:ViaService"])
    assert via.startswith("s3.") and via.count("TOKEN") == 2   # s3.<region>.<url suffix>
    contexts = [flatten(a).split(":s3:::", 1)[1] for a in data_key["Condition"][
        "ForAnyValue:StringEquals"]["kms:EncryptionContext:aws:s3:arn"]]
    assert contexts == [obj, obj.split("/", 1)[0]]
