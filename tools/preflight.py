"""Before `cdk deploy`: can this account and region take this environment?

    python -m tools preflight --env china
    python -m tools preflight --env china --offline   # what it would check: no credentials

Checks, with the caller's credentials (read-only calls): the credentials are the environment's
account; the services the variant needs exist in the region; the zones exist; every node
group's instance types are offered in every chosen zone; the EC2 vCPU quotas cover the node
groups (desired sizes must fit, max sizes should); the Kubernetes version is offered by EKS;
where the environment has ElastiCache, the engine version and parameter group family the Cache
stack renders are offered in the region; on an existing VPC, that its subnets are as the file
says and each private subnet reaches what nodes and pods call (VPC endpoints or a default
route through a NAT or transit gateway), every missing service named, and in a private-only one
that the addresses each router's internal load balancer asks for are free; the mirrored images and charts are in ECR (images
with their pinned digests), one row each; Amazon Managed Grafana's IAM Identity Center is there
where the environment asks for it; each endpoint's model is in the bucket. One table, and exit 1 when any row is a blocker (FAIL).
"""
from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable

from config import EnvironmentConfig
from config.regions import CACHE_ENGINE_FAMILIES
from config.instances import EFA, gpu_shape
from config.arguments import ToolError, add_command, load_environment, out_console
from tools.cli import Aws, describe_aws_error, error_code, load_endpoints

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"
TO_CHECK = "TO CHECK"     # --offline: what a run with credentials would ask

# EC2 vCPU quotas by instance class and purchase option (service code ec2).
QUOTAS = {
    ("G and VT", "ON_DEMAND"): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("P", "ON_DEMAND"): ("L-417A185B", "Running On-Demand P instances"),
    ("Standard", "ON_DEMAND"): ("L-1216C47A", "Running On-Demand Standard instances"),
    ("G and VT", "SPOT"): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ("P", "SPOT"): ("L-7212CCBC", "All P Spot Instance Requests"),
    ("Standard", "SPOT"): ("L-34B43A08", "All Standard Spot Instance Requests"),
}
_STANDARD = set("acdhimrtz")

# What nodes and pods in the private subnets call, as VPC endpoint service names end
# (com.amazonaws.REGION.NAME, or cn.com.amazonaws.REGION.NAME in China): the endpoints a VPC
# this app creates gets (config/regions.py, constructs/network.py), EKS's included, and the
# Cluster Autoscaler's Auto Scaling.
NODE_SERVICES = {
    "ecr.api": "ECR API", "ecr.dkr": "ECR images", "s3": "S3 (image layers, models)",
    "sts": "STS", "eks": "EKS", "eks-auth": "EKS Pod Identity", "ec2": "EC2",
    "elasticloadbalancing": "ELB", "logs": "CloudWatch Logs",
    "secretsmanager": "Secrets Manager", "kms": "KMS",
    "autoscaling": "Auto Scaling (Cluster Autoscaler)",
}


def node_services(cfg: EnvironmentConfig) -> dict[str, str]:
    """NODE_SERVICES, and AMP's where the environment's metrics go there (KEDA queries it)."""
    if cfg.observability == "managed":
        return {**NODE_SERVICES, "aps-workspaces": "Amazon Managed Prometheus"}
    return dict(NODE_SERVICES)
# Default-route targets that reach beyond the VPC: a NAT gateway, a transit gateway (an
# egress VPC or the corporate network), or an appliance's interface (a NAT instance, a firewall).
_EGRESS = ("NatGatewayId", "TransitGatewayId", "NetworkInterfaceId", "InstanceId")


def _family(offered: dict[str, str], version: str) -> str | None:
    """The parameter group family of `version` (major.minor) among the region's versions,
    which may carry a patch (`7.2.6`)."""
    return next((f for v, f in offered.items() if v == version or
                 v.startswith(version + ".")), None)


@dataclass(frozen=True)
class Row:
    check: str
    status: str
    detail: str


def instance_class(instance_type: str) -> str:
    family = instance_type.split(".")[0]
    if family.startswith(("g", "vt")):
        return "G and VT"
    if family.startswith("p"):
        return "P"
    if family[0] in _STANDARD:
        return "Standard"
    raise ToolError.bad_input("instance type", instance_type, "G, VT, P or standard families")


def needed_services(cfg: EnvironmentConfig) -> list[str]:
    """boto3 service names the stacks use in this variant."""
    services = ["cloudformation", "sts", "ec2", "eks", "eks-auth", "s3", "ecr", "kms", "logs",
                "iam", "elbv2", "ssm"]
    if cfg.cache.kind == "elasticache":
        services += ["elasticache", "secretsmanager"]
    if cfg.observability == "managed":
        services += ["amp", "grafana"]
    return services


class Preflight:
    def __init__(self, aws: Aws, endpoints: Iterable[Any], *, bucket: str | None = None,
                 images: Iterable[Any] | None = None) -> None:
        from k8s.serving import environment_images

        self.aws, self.cfg = aws, aws.cfg
        self.endpoints = tuple(endpoints)
        self.bucket = bucket
        self.images = list(environment_images(self.cfg, self.endpoints)
                           if images is None else images)

    def run(self) -> list[Row]:
        # Every other check calls AWS with these credentials: without working ones each would
        # fail with the same message, so the table holds that one row.
        try:
            rows: list[Row] = self.credentials()
        except ToolError:
            raise
        except Exception as err:
            return [Row("credentials", FAIL, f"{describe_aws_error(err)} (every other check "
                        "needs them: nothing else was checked)")]
        for check in (self.services, self.identity_center, self.zones, self.network_reach,
                      self.load_balancer_addresses,
                      self.offerings, self.efa, self.quotas, self.kubernetes, self.cache_engine,
                      self.images_in_ecr, self.charts_in_ecr, self.models):
            try:
                rows += check()
            except ToolError:
                raise
            except Exception as err:  # one broken check must not hide the others
                rows.append(Row(check.__name__.replace("_", " "), FAIL,
                                describe_aws_error(err)))
        return rows

    # -- checks, in the order the table shows them

    def credentials(self) -> list[Row]:
        ident = self.aws.client("sts").get_caller_identity()
        ok = ident["Account"] == self.cfg.account
        return [Row("credentials", PASS if ok else FAIL,
                    f"{ident['Arn']}" if ok else f"account {ident['Account']} is not the "
                    f"environment's {self.cfg.account}: use that account's credentials")]

    def services(self) -> list[Row]:
        import boto3

        session = boto3.session.Session()
        missing = [s for s in needed_services(self.cfg) if s != "iam" and self.cfg.region
                   not in session.get_available_regions(s, self.cfg.facts.partition)]
        wanted = ", ".join(needed_services(self.cfg))
        if missing:
            return [Row("services", FAIL, f"not in {self.cfg.region}: {', '.join(missing)}")]
        return [Row("services", PASS, f"{wanted} (botocore endpoint data)")]

    def identity_center(self) -> list[Row]:
        """Amazon Managed Grafana signs users in through IAM Identity Center; without an
        instance its workspace fails ("SSO is not enabled"), and every stack after it."""
        if not self.cfg.managed_grafana:
            return []
        instances = self.aws.client("sso-admin").list_instances()["Instances"]
        if not instances:
            return [Row("IAM Identity Center", FAIL, f"no instance in {self.cfg.region}: "
                        "Amazon Managed Grafana needs one; enable IAM Identity Center, or set "
                        f'"grafana": "none" in the environment file of {self.cfg.name}')]
        return [Row("IAM Identity Center", PASS, instances[0]["InstanceArn"])]

    def zones(self) -> list[Row]:
        zones = self.aws.client("ec2").describe_availability_zones(
            Filters=[{"Name": "zone-name", "Values": list(self.cfg.availability_zones)}],
            AllAvailabilityZones=True)["AvailabilityZones"]
        state = {z["ZoneName"]: (z.get("State"), z.get("OptInStatus")) for z in zones}
        bad = [f"{z} ({'missing' if z not in state else state[z][0]})"
               for z in self.cfg.availability_zones
               if state.get(z, (None,))[0] != "available"
               or state[z][1] not in (None, "opt-in-not-required", "opted-in")]
        if bad:
            return [Row("zones", FAIL, "not available to this account: " + ", ".join(bad))]
        return [Row("zones", PASS, ", ".join(self.cfg.availability_zones))]

    def network_reach(self) -> list[Row]:
        """An existing VPC: its subnets are the file's (id, VPC, zone, CIDR, route table), and
        each private subnet reaches every service in node_services: by an available interface
        endpoint with private DNS (S3 also by a gateway endpoint on the subnet's route table), or
        by an active default route to a NAT gateway, transit gateway or appliance. Nothing is
        created in that VPC, so a gap here is an image pull or a node join that hangs."""
        net = self.cfg.network
        if not net.existing:
            return []
        ec2 = self.aws.client("ec2")
        wanted = {s.subnet_id: s for s in net.private_subnets}
        found = {s["SubnetId"]: s for s in ec2.describe_subnets(Filters=[   # ids: no error
            {"Name": "subnet-id", "Values": list(wanted)}])["Subnets"]}
        vpc = [("VpcId", "existingVpc.vpcId", net.vpc_id)]
        rows = []
        for sid, sub in wanted.items():
            got = found.get(sid)
            if got is None:
                rows.append(Row(f"subnet {sid}", FAIL, f"not in account {self.cfg.account} "
                                f"{self.cfg.region}: existingVpc.privateSubnets"))
                continue
            for key, field, value in (*vpc, ("AvailabilityZone", "zone", sub.zone),
                                      ("CidrBlock", "cidr", sub.cidr)):
                if got.get(key) != value:
                    rows.append(Row(f"subnet {sid}", FAIL, f"{key} is {got.get(key)}, the "
                                    f"file says {value} ({field}): correct the environment "
                                    "file"))
        tables = ec2.describe_route_tables(
            Filters=[{"Name": "vpc-id", "Values": [net.vpc_id]}])["RouteTables"]
        main = next((t for t in tables if any(a.get("Main") for a in
                                              t.get("Associations", []))), None)
        endpoints = [e for e in ec2.describe_vpc_endpoints(
            Filters=[{"Name": "vpc-id", "Values": [net.vpc_id]}])["VpcEndpoints"]
            if e.get("State", "").lower() == "available"]
        for sid, sub in wanted.items():
            table = next((t for t in tables for a in t.get("Associations", [])
                          if a.get("SubnetId") == sid), main)
            if table is None:
                rows.append(Row(f"reach: {sid}", FAIL, f"no route table in {net.vpc_id}"))
                continue
            if table["RouteTableId"] != sub.route_table_id:
                rows.append(Row(f"subnet {sid}", FAIL, f"its route table is "
                                f"{table['RouteTableId']}, the file says "
                                f"{sub.route_table_id} (routeTableId): correct the file"))
            egress = next((f"{k.removesuffix('Id')} {r[k]}" for r in table.get("Routes", [])
                           if r.get("DestinationCidrBlock") == "0.0.0.0/0"
                           and r.get("State") == "active" for k in _EGRESS if r.get(k)), None)
            if egress:
                rows.append(Row(f"reach: {sid} ({sub.zone})", PASS, f"default route to "
                                f"{egress}"))
                continue
            services = node_services(self.cfg)
            missing = [n for n in services
                       if not self._endpoint(endpoints, n, table["RouteTableId"])]
            if missing:
                rows.append(Row(f"reach: {sid} ({sub.zone})", FAIL, "no default route to a "
                                "NAT or transit gateway, and no VPC endpoint for " + ", ".join(
                                    f"{n} ({services[n]})" for n in missing) +
                                ": add interface endpoints with private DNS (S3: a gateway "
                                f"endpoint on {table['RouteTableId']}), or a default route"))
            else:
                rows.append(Row(f"reach: {sid} ({sub.zone})", PASS, "VPC endpoints for "
                                + ", ".join(services)))
        return rows

    def load_balancer_addresses(self) -> list[Row]:
        """A private-only VPC: the fixed addresses each router's internal NLB asks for are free,
        or already a load balancer's. One held by a pod or anything else would make the NLB's
        creation fail, and be admitted to the router in its place (docs/security.md)."""
        net = self.cfg.network
        if not net.private_only or not self.endpoints:
            return []
        from config.network import load_balancer_addresses
        from k8s.router import router_name

        wanted = {a: e.name for e in self.endpoints
                  for a in load_balancer_addresses(net, e.name)}
        held = {}
        for page in self.aws.client("ec2").get_paginator(
                "describe_network_interfaces").paginate(Filters=[
                    {"Name": "vpc-id", "Values": [net.vpc_id]},
                    {"Name": "addresses.private-ip-address", "Values": sorted(wanted)}]):
            for eni in page["NetworkInterfaces"]:
                for a in eni.get("PrivateIpAddresses", []):
                    held[a.get("PrivateIpAddress")] = eni
        rows = []
        for e in self.endpoints:
            mine = [a for a, n in wanted.items() if n == e.name]
            taken = [(a, held[a]) for a in mine if a in held and
                     held[a].get("InterfaceType") != "network_load_balancer"]
            check = f"load balancer: {router_name(e.name)}"
            if taken:
                rows.append(Row(check, FAIL, "; ".join(
                    f"{a} is held by {i['NetworkInterfaceId']} "
                    f"({i.get('Description') or i.get('InterfaceType') or 'an interface'})"
                    for a, i in taken) + ": free it before the Serving stack deploys, or "
                    "rename the endpoint (its name gives its slot)"))
            else:
                rows.append(Row(check, PASS, ", ".join(mine) + " free or its load "
                                "balancer's"))
        return rows

    def _endpoint(self, endpoints: list[dict], name: str, route_table: str) -> bool:
        suffix = f".{self.cfg.region}.{name}"
        for e in endpoints:
            if not e.get("ServiceName", "").endswith(suffix):
                continue
            kind = e.get("VpcEndpointType", "").lower()
            if kind == "interface" and e.get("PrivateDnsEnabled"):
                return True
            if kind == "gateway" and route_table in e.get("RouteTableIds", []):
                return True
        return False

    def offerings(self) -> list[Row]:
        groups = (self.cfg.system_nodes, *self.cfg.gpu_node_groups)
        types = sorted({t for g in groups for t in g.instance_types})
        offered: dict[str, set[str]] = defaultdict(set)
        pages = self.aws.client("ec2").get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": types},
                     {"Name": "location", "Values": list(self.cfg.availability_zones)}])
        for page in pages:
            for o in page["InstanceTypeOfferings"]:
                offered[o["InstanceType"]].add(o["Location"])
        rows = []
        for t in types:
            missing = [z for z in self.cfg.availability_zones if z not in offered[t]]
            rows.append(Row(f"offered: {t}", FAIL if missing else PASS,
                            f"not offered in {', '.join(missing)}: node groups span every zone"
                            if missing else "in " + ", ".join(self.cfg.availability_zones)))
        return rows

    def efa(self) -> list[Row]:
        """EFA node groups (disaggregated prefill/decode): EC2 asked whether each type carries
        EFA here and how many interfaces, against the instance table the launch template is
        built from (config/instances.py EFA)."""
        types = sorted({t for g in self.cfg.gpu_node_groups if g.efa for t in g.instance_types})
        if not types:
            return []
        answer = {it["InstanceType"]: it.get("NetworkInfo", {}) for it in
                  self.aws.client("ec2").describe_instance_types(
                      InstanceTypes=types)["InstanceTypes"]}
        return [efa_row(t, answer.get(t), self.cfg.region) for t in types]

    def quotas(self) -> list[Row]:
        groups = (self.cfg.system_nodes, *self.cfg.gpu_node_groups)
        vcpus = self._vcpus({t for g in groups for t in g.instance_types})
        need_max: dict[tuple, int] = defaultdict(int)
        need_desired: dict[tuple, int] = defaultdict(int)
        for g in groups:
            per_node = max(vcpus[t] for t in g.instance_types)
            key = (instance_class(g.instance_types[0]), g.capacity_type)
            need_max[key] += g.max_size * per_node
            need_desired[key] += g.desired_size * per_node
        sq = self.aws.client("service-quotas")
        rows = []
        for key in sorted(need_max):
            code, name = QUOTAS[key]
            try:
                value = sq.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]
            except Exception as err:
                if error_code(err) != "NoSuchResourceException":
                    raise
                value = sq.get_aws_default_service_quota(
                    ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]
            status = (FAIL if value < need_desired[key] else WARN if value < need_max[key]
                      else PASS)
            rows.append(Row(f"quota: {name}", status,
                            f"{value:g} vCPUs ({code}); node groups need {need_desired[key]} at "
                            f"desired size, {need_max[key]} at max size (instances already "
                            "running in the region count too)"))
        return rows

    def _vcpus(self, types: set[str]) -> dict[str, int]:
        out = {t: gpu_shape(t).vcpus for t in types if gpu_shape(t)}
        rest = sorted(types - set(out))
        if rest:
            for it in self.aws.client("ec2").describe_instance_types(
                    InstanceTypes=rest)["InstanceTypes"]:
                out[it["InstanceType"]] = it["VCpuInfo"]["DefaultVCpus"]
        return out

    def kubernetes(self) -> list[Row]:
        version = self.cfg.kubernetes_version
        eks = self.aws.client("eks")
        try:
            found = eks.describe_cluster_versions(clusterVersions=[version],
                                                  includeAll=True)["clusterVersions"]
        except Exception as err:  # older partitions or policies: add-ons published instead
            if error_code(err) not in ("AccessDeniedException", "UnknownOperationException",
                                       "InvalidAction"):
                raise
            addons = eks.describe_addon_versions(kubernetesVersion=version,
                                                 maxResults=1)["addons"]
            return [Row(f"EKS {version}", PASS if addons else FAIL,
                        f"add-ons are published for {version}" if addons else
                        f"no add-on versions for {version} in {self.cfg.region}")]
        if not found:
            return [Row(f"EKS {version}", FAIL, f"not offered in {self.cfg.region}")]
        status = found[0].get("versionStatus") or found[0].get("status", "")
        ok = status.upper().replace("-", "_") in ("STANDARD_SUPPORT", "EXTENDED_SUPPORT")
        until = found[0].get("endOfStandardSupportDate")
        detail = status + (f", standard support until {until:%Y-%m-%d}" if until else "")
        return [Row(f"EKS {version}", PASS if ok else FAIL, detail)]

    def cache_engine(self) -> list[Row]:
        """The engine version and parameter group family the Cache stack renders
        (config/regions.py, constructs/kv_cache.py), as the region offers them: either one
        missing would surface only as a Cache-stack rollback."""
        c = self.cfg.cache
        if c.kind != "elasticache":
            return []
        offered: dict[str, str] = {}     # engine version -> its parameter group family
        pages = self.aws.client("elasticache").get_paginator(
            "describe_cache_engine_versions").paginate(Engine=c.engine)
        for page in pages:
            for v in page["CacheEngineVersions"]:
                offered[v["EngineVersion"]] = v["CacheParameterGroupFamily"]
        region, check = self.cfg.region, f"ElastiCache {c.engine} {c.engine_version}"
        family = _family(offered, c.engine_version)
        if family is None:
            return [Row(check, FAIL, f"not offered in {region} (it offers {c.engine} "
                        f"{', '.join(offered) or 'in no version'}): set cache.engineVersion to "
                        "one of them, and correct config/regions.py")]
        if family != c.parameter_group_family:
            return [Row(check, FAIL, f"{region} gives {c.engine} {c.engine_version} the "
                        f"parameter group family {family}; the Cache stack renders "
                        f"{c.parameter_group_family} (config/regions.py CACHE_ENGINE_FAMILIES), "
                        "which CloudFormation would refuse")]
        asked = c.requested_engine_version
        if asked and _family(offered, asked) == CACHE_ENGINE_FAMILIES[c.engine][asked]:
            return [Row(check, WARN, f"{region} offers {c.engine} {asked}, which the file asks "
                        f"for, but config/regions.py says it does not, so {c.engine_version} is "
                        f"rendered: add {asked} to {region} there")]
        return [Row(check, PASS, f"offered in {region}, parameter group family {family}"
                    + (f" (the file asks {asked}, not offered there: config/regions.py)"
                       if asked else ""))]

    def images_in_ecr(self) -> list[Row]:
        """The images pods pull from the account's ECR: all of them where the environment uses
        its mirror, else only those we build (the router image exists nowhere else)."""
        rows = []
        images = [i for i in self.images
                  if self.cfg.use_ecr_images or getattr(i, "built_from", None)]
        if not self.cfg.use_ecr_images:
            rows.append(Row("images", SKIP, "the environment pulls the others from the "
                            "upstream registries"))
        for image in images:
            check = f"image: {image.key}"
            digest = self._in_ecr(rows, check, image.mirror_repository, image.tag)
            if digest is None:
                continue
            if image.digest is None:
                rows.append(Row(check, WARN, f"{image.tag} present as {digest}; the catalogue "
                                "pins no digest yet"))
            elif digest != image.digest:
                rows.append(Row(check, FAIL, f"{image.tag} is {digest}, the catalogue pins "
                                f"{image.digest}"))
            else:
                rows.append(Row(check, PASS, f"{image.mirror_repository}:{image.tag}"))
        return rows

    def charts_in_ecr(self) -> list[Row]:
        """The Cluster and Monitoring stacks install these charts from the mirror: before
        `python -m tools mirror` has pushed them, `cdk deploy` fails there."""
        from config.images import CHARTS

        if not self.cfg.use_ecr_images:
            return [Row("charts", SKIP, "the environment installs charts from their upstream "
                        "repositories")]
        rows: list[Row] = []
        for chart in CHARTS.values():
            check = f"chart: {chart.key} {chart.version}"
            if self._in_ecr(rows, check, chart.mirror_repository, chart.version):
                rows.append(Row(check, PASS, f"{chart.mirror_repository}:{chart.version}"))
        return rows

    def _in_ecr(self, rows: list[Row], check: str, repository: str, tag: str) -> str | None:
        """The digest of repository:tag in the account's ECR; None after a FAIL row saying
        what to run."""
        try:
            found = self.aws.client("ecr").describe_images(
                repositoryName=repository, imageIds=[{"imageTag": tag}])["imageDetails"]
        except Exception as err:
            code = error_code(err)
            if code == "RepositoryNotFoundException":
                rows.append(Row(check, FAIL, f"no repository {repository}: deploy "
                                f"{self.cfg.stack_prefix}-Storage"))
                return None
            if code == "ImageNotFoundException":
                rows.append(Row(check, FAIL, f"{repository}:{tag} missing: run python -m "
                                "tools mirror"))
                return None
            raise
        return found[0]["imageDigest"]

    def models(self) -> list[Row]:
        if not self.endpoints:
            return [Row("models", SKIP, "the environment lists no endpoint files")]
        bucket = self.bucket
        if bucket is None:
            try:
                bucket = self.aws.stack_output("Storage", "ModelBucketName")
            except ToolError as err:
                return [Row(f"model: {e.name}", FAIL, f"{err}; then upload-model")
                        for e in self.endpoints]
        s3 = self.aws.client("s3")
        rows = []
        for e in self.endpoints:
            keys = []
            for page in s3.get_paginator("list_objects_v2").paginate(
                    Bucket=bucket, Prefix=e.model_location + "/"):
                keys += [o["Key"] for o in page.get("Contents", [])]
            weights = [k for k in keys if k.endswith(".safetensors")]
            has_config = f"{e.model_location}/config.json" in keys
            where = f"s3://{bucket}/{e.model_location}/"
            if weights and has_config:
                rows.append(Row(f"model: {e.name}", PASS, f"{where}: {len(weights)} safetensors"))
            else:
                rows.append(Row(f"model: {e.name}", FAIL, f"{where}: "
                                f"{'no *.safetensors' if not weights else 'no config.json'}; "
                                "run python -m tools upload-model"))
        return rows


# --------------------------------------------------------------------------- command


def efa_row(instance_type: str, network_info: dict | None, region: str) -> Row:
    """One EFA node group type: what EC2's DescribeInstanceTypes says (NetworkInfo.EfaSupported,
    EfaInfo.MaximumEfaInterfaces) against config/instances.py's record of it."""
    recorded = EFA.get(instance_type)
    check = f"efa: {instance_type}"
    if not network_info or not network_info.get("EfaSupported"):
        return Row(check, FAIL, f"EC2 says {instance_type} has no EFA in {region}: an EFA node "
                   "group (and P/D) cannot run on it")
    interfaces = (network_info.get("EfaInfo") or {}).get("MaximumEfaInterfaces")
    if recorded is None or interfaces != recorded.interfaces:
        return Row(check, FAIL, f"EC2 says {interfaces} EFA interfaces, config/instances.py EFA "
                   f"records {recorded.interfaces if recorded else 'none'}: the launch "
                   "template is built from the record; correct it")
    return Row(check, PASS, f"{interfaces} EFA interfaces, as recorded")


def offline_rows(cfg: EnvironmentConfig, endpoints: Iterable[Any]) -> list[Row]:
    """What Preflight.run would check, row by row in its order, from the environment file
    alone: no credentials, no AWS client (`--offline`)."""
    from config.images import CHARTS
    from config.network import load_balancer_addresses
    from k8s.serving import environment_images

    endpoints = tuple(endpoints)
    net, region = cfg.network, cfg.region
    groups = (cfg.system_nodes, *cfg.gpu_node_groups)
    rows = [Row("credentials", TO_CHECK, f"sts:GetCallerIdentity is account {cfg.account}"),
            Row("services", TO_CHECK, f"offered in {region}: "
                + ", ".join(s for s in needed_services(cfg) if s != "iam"))]
    if cfg.managed_grafana:
        rows.append(Row("IAM Identity Center", TO_CHECK, f"an instance in {region}"))
    rows.append(Row("zones", TO_CHECK, "available: " + ", ".join(cfg.availability_zones)))
    if net.existing:
        reach = ", ".join(node_services(cfg))
        for sub in net.private_subnets:
            rows.append(Row(f"subnet {sub.subnet_id}", TO_CHECK, f"in {net.vpc_id}, {sub.zone}, "
                            f"{sub.cidr}, route table {sub.route_table_id}"))
            rows.append(Row(f"reach: {sub.subnet_id} ({sub.zone})", TO_CHECK, f"{reach}: by VPC "
                            "endpoints or a default route to a NAT or transit gateway"))
    if net.private_only:
        for e in endpoints:
            rows.append(Row(f"load balancer addresses: {e.name}", TO_CHECK, "free or its load "
                            "balancer's: " + ", ".join(load_balancer_addresses(net, e.name))))
    for t in sorted({t for g in groups for t in g.instance_types}):
        rows.append(Row(f"offered: {t}", TO_CHECK, "in " + ", ".join(cfg.availability_zones)))
    for t in sorted({t for g in cfg.gpu_node_groups if g.efa for t in g.instance_types}):
        rows.append(Row(f"efa: {t}", TO_CHECK, "EFA interfaces as config/instances.py records"))
    for key in sorted({(instance_class(g.instance_types[0]), g.capacity_type) for g in groups}):
        code, name = QUOTAS[key]
        rows.append(Row(f"quota: {name}", TO_CHECK, f"{code} covers the node groups' vCPUs"))
    rows.append(Row(f"EKS {cfg.kubernetes_version}", TO_CHECK, f"offered in {region}"))
    if cfg.cache.kind == "elasticache":
        c = cfg.cache
        rows.append(Row(f"ElastiCache {c.engine} {c.engine_version}", TO_CHECK,
                        f"offered in {region}, parameter group family {c.parameter_group_family}"))
    for image in environment_images(cfg, endpoints):
        if cfg.use_ecr_images or getattr(image, "built_from", None):
            rows.append(Row(f"image: {image.key}", TO_CHECK, f"{image.mirror_repository}:"
                            f"{image.tag} in ECR" + (f" as {image.digest}" if image.digest
                                                     else "")))
    if cfg.use_ecr_images:
        for chart in CHARTS.values():
            rows.append(Row(f"chart: {chart.key} {chart.version}", TO_CHECK,
                            f"{chart.mirror_repository}:{chart.version} in ECR"))
    for e in endpoints:
        rows.append(Row(f"model: {e.name}", TO_CHECK, f"config.json and *.safetensors under "
                        f"the model bucket's {e.model_location}/ ({cfg.stack_prefix}-Storage "
                        "ModelBucketName, or --bucket)"))
    return rows


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "preflight", main, "check an account and region before cdk deploy",
                    __doc__)
    p.add_argument("--bucket", help="model bucket instead of the Storage stack's output")
    p.add_argument("--offline", action="store_true", help="list what would be checked, from "
                   "the environment file alone: no credentials, no AWS call")


def main(args: argparse.Namespace, aws: Aws | None = None) -> int:
    cfg = load_environment(args)
    endpoints = load_endpoints(cfg)
    if getattr(args, "offline", False):
        return print_rows(cfg, offline_rows(cfg, endpoints))
    rows = Preflight(aws or Aws(cfg, args.profile), endpoints, bucket=args.bucket).run()
    return print_rows(cfg, rows)


def print_rows(cfg: EnvironmentConfig, rows: list[Row]) -> int:
    from rich.table import Table

    colour = {PASS: "green", WARN: "yellow", FAIL: "bold red", SKIP: "dim", TO_CHECK: "cyan"}
    table = Table("check", "status", "detail", title=f"preflight: {cfg.name} "
                  f"({cfg.account}, {cfg.region})", title_justify="left")
    for r in rows:
        table.add_row(r.check, f"[{colour[r.status]}]{r.status}[/]", r.detail)
    out_console.print(table)
    blockers = [r for r in rows if r.status == FAIL]
    if blockers:
        raise ToolError(f"{len(blockers)} blocker(s): " + "; ".join(
            f"{r.check}: {r.detail}" for r in blockers[:3]))
    return 0
