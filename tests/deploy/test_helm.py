"""The Helm chart (deploy/helm/gpugap): ``helm lint``, ``helm template`` with the default values
and with everything on (tests/deploy/values-all.yaml), assertions on the rendered objects, and
every rendered object applied with server-side dry-run to a real kube-apiserver, with the real
CRDs of the Prometheus Operator and Strimzi installed (tests/fixtures/crds/README.md).

The helm binary is built once from the Go module proxy (tests/harness/helm.py); a build that fails
fails these tests. The apiserver is the session's (tests/conftest.py ``kube``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import re
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.helm import ensure_built, run_helm

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpugap"
VALUES_ALL = Path(__file__).with_name("values-all.yaml")
CRDS = ROOT / "tests" / "fixtures" / "crds"
NAMESPACE = "gpugap"
RELEASE = "gpugap"
WORKLOADS = {"Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob"}
SECRETISH = re.compile(r"(PASSWORD|TOKEN|SECRET|WEBHOOK_URL|KEY|CERT|CAFILE)(_FILE)?$")
READ_ONLY_VERBS = {"get", "list", "watch"}
#: the one container that runs as uid 0: the NVML agent, exactly as deploy/nvml-agent.yaml
ROOT_CONTAINERS = {("DaemonSet", "gpugap-nvml-agent", "agent")}


# --- rendering -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def helm() -> Path:
    return ensure_built()  # HelmBuildError: the chart tests fail, they never skip


def render(helm: Path, *args: str) -> list[dict[str, Any]]:
    out = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


VARIANTS: dict[str, tuple[str, ...]] = {
    "default": (),
    "all": ("-f", str(VALUES_ALL)),
    # the dcgm-exporter scraper instead of the NVML DaemonSet, with a topic prefix
    "dcgm": (
        "-f", str(VALUES_ALL),
        "--set", "deviceAgent.mode=dcgm",
        "--set", "deviceAgent.dcgm.endpoints={http://node-1:9400/metrics,http://node-2:9400/metrics}",
        "--set", "kafka.topicPrefix=prod.",
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def rendered(helm: Path) -> dict[str, list[dict[str, Any]]]:
    return {name: render(helm, *args) for name, args in VARIANTS.items()}


def kinds(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return obj["spec"]["template"]["spec"]


def containers(objs: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for obj in objs:
        if obj["kind"] in WORKLOADS:
            spec = pod_spec(obj)
            for c in [*spec.get("initContainers", []), *spec["containers"]]:
                yield obj, c


def test_lint_default_and_all_on(helm: Path) -> None:
    for args in (("--strict",), ("--strict", "-f", str(VALUES_ALL))):
        proc = run_helm(helm, "lint", str(CHART), *args)
        assert "0 chart(s) failed" in proc.stdout, proc.stdout


def test_each_part_renders_and_turns_off(rendered: dict[str, list[dict[str, Any]]]) -> None:
    default = {(o["kind"], o["metadata"]["name"]) for o in rendered["default"]}
    assert default == {
        ("Deployment", "gpugap-worker"), ("Deployment", "gpugap-sink"),
        ("Deployment", "gpugap-notify"), ("Deployment", "gpugap-web"),
        ("Service", "gpugap-web"), ("Deployment", "gpugap-kubernetes-producer"),
        ("ServiceAccount", "gpugap-kubernetes-producer"),
        ("ClusterRole", "gpugap-kubernetes-producer"),
        ("ClusterRoleBinding", "gpugap-kubernetes-producer"),
        ("DaemonSet", "gpugap-nvml-agent"), ("Job", "gpugap-migrate"),
    }  # fmt: skip
    everything = {o["kind"] for o in rendered["all"]}
    assert {"CronJob", "ServiceMonitor", "PodMonitor", "PrometheusRule", "KafkaTopic"} <= everything
    dcgm = {(o["kind"], o["metadata"]["name"]) for o in rendered["dcgm"]}
    assert ("Deployment", "gpugap-dcgm-scraper") in dcgm
    assert not any(k == "DaemonSet" for k, _ in dcgm)


def test_everything_off_renders_nothing(helm: Path) -> None:
    off = [
        f"{part}.enabled=false"
        for part in ("worker", "sink", "notify", "web", "kubernetesProducer", "deviceAgent",
                     "digest", "migrations", "serviceMonitor", "prometheusRule", "kafkaTopics")
    ]  # fmt: skip
    assert render(helm, "--set", ",".join(off)) == []


def test_every_container_is_locked_down(rendered: dict[str, list[dict[str, Any]]]) -> None:
    nvml = next(
        c
        for c in yaml.safe_load((ROOT / "deploy" / "nvml-agent.yaml").read_text())["spec"][
            "template"
        ]["spec"]["containers"]
    )
    for variant, objs in rendered.items():
        seen = 0
        for obj, c in containers(objs):
            seen += 1
            where = f"{variant}: {obj['kind']}/{obj['metadata']['name']} container {c['name']}"
            sc = c.get("securityContext") or {}
            assert sc.get("readOnlyRootFilesystem") is True, where
            assert sc.get("allowPrivilegeEscalation") is False, where
            assert sc.get("capabilities") == {"drop": ["ALL"]}, where
            assert sc.get("seccompProfile") == {"type": "RuntimeDefault"}, where
            assert "privileged" not in sc and "add" not in sc["capabilities"], where
            if (obj["kind"], obj["metadata"]["name"], c["name"]) in ROOT_CONTAINERS:
                assert sc == nvml["securityContext"], f"{where}: more than deploy/nvml-agent.yaml"
            else:
                assert sc.get("runAsNonRoot") is True, where
                assert "runAsUser" not in sc or sc["runAsUser"] != 0, where
                pod_sc = pod_spec(obj)["securityContext"]
                assert pod_sc["runAsNonRoot"] is True and pod_sc["runAsUser"] != 0, where
            spec = pod_spec(obj)
            assert not spec.get("hostNetwork") and not spec.get("hostPID"), where
            for vol in spec.get("volumes", []):
                if "hostPath" in vol:  # only the agent's read-only PodResources directory
                    assert obj["kind"] == "DaemonSet", where
                    mount = next(m for m in c["volumeMounts"] if m["name"] == vol["name"])
                    assert mount["readOnly"] is True, where
            res = c.get("resources") or {}
            assert res.get("requests", {}).keys() >= {"cpu", "memory"}, where
            assert "memory" in res.get("limits", {}), where
            assert c["command"] == ["gpugap"], where
            token = spec.get("automountServiceAccountToken")
            if obj["metadata"]["name"] == "gpugap-kubernetes-producer":
                assert token is True and spec["serviceAccountName"] == "gpugap-kubernetes-producer"
            else:
                assert token is False, f"{where}: no API token for what never calls the API"
        assert seen >= 6, variant


def test_probes_where_the_component_serves_http(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """/healthz on the worker (--http) and the web (--port); no HTTP probe on what serves none."""
    for variant, objs in rendered.items():
        for obj, c in containers(objs):
            probes = [c[p] for p in ("livenessProbe", "readinessProbe", "startupProbe") if p in c]
            name = obj["metadata"]["name"]
            if name in ("gpugap-worker", "gpugap-web"):
                assert probes, f"{variant}: {name} has no probe"
                port = c["ports"][0]
                for probe in probes:
                    assert probe["httpGet"] == {"path": "/healthz", "port": port["name"]}
                args = c["args"]
                if name == "gpugap-worker":
                    assert args[args.index("--http") + 1] == f"0.0.0.0:{port['containerPort']}"
                else:
                    assert args[args.index("--port") + 1] == str(port["containerPort"])
                    assert args[args.index("--host") + 1] == "0.0.0.0"
            else:
                assert not probes, f"{variant}: {name} serves no HTTP, yet has a probe"


def test_args_are_real_gpugap_commands(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """Each container's args parse with gpugap's own parser (no invented flag survives)."""
    from gpugap.cli import build_parser

    parser = build_parser()
    for variant, objs in rendered.items():
        for _obj, c in containers(objs):
            try:
                ns = parser.parse_args(c["args"])
            except SystemExit as exc:
                raise AssertionError(f"{variant}: gpugap {' '.join(c['args'])}: rejected") from exc
            assert isinstance(ns, argparse.Namespace)
            if c["args"][:1] == ["notify"]:
                assert set(ns.names) <= {"alertmanager", "slack", "webhook", "email", "console"}


def _setting_names() -> set[str]:
    from pydantic_settings import BaseSettings

    for mod in ("gpugap.groundfloor.settings", "gpugap.producers.kubernetes.settings",
                "gpugap.producers.nvml.settings", "gpugap.producers.dcgm.settings",
                "gpugap.sinks.alertmanager.settings", "gpugap.sinks.slack.settings",
                "gpugap.sinks.email.settings", "gpugap.sinks.webhook.settings",
                "gpugap.streams.settings", "gpugap.report.monthly_send"):  # fmt: skip
        importlib.import_module(mod)

    def walk(cls: type[BaseSettings]) -> Iterator[type[BaseSettings]]:
        for sub in cls.__subclasses__():
            yield sub
            yield from walk(sub)

    names = {"GPUGAP_NOTIFY_TARGETS", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"}
    for cls in walk(BaseSettings):
        prefix = str(cls.model_config.get("env_prefix", ""))
        if prefix:
            names |= {f"{prefix}{f}".upper() for f in cls.model_fields}
    return names


def test_env_names_are_settings_the_code_reads(rendered: dict[str, list[dict[str, Any]]]) -> None:
    known = _setting_names()
    for variant, objs in rendered.items():
        for obj, c in containers(objs):
            names = [e["name"] for e in c["env"]]
            assert len(names) == len(set(names)), f"{variant}: {c['name']}: env named twice"
            unknown = sorted(set(names) - known)
            assert not unknown, f"{variant}: {obj['metadata']['name']}: {unknown} read by nothing"


def test_secrets_only_as_files_from_existing_secrets(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    values = yaml.safe_load(VALUES_ALL.read_text())
    named = set(re.findall(r"(?:name|secret): ([a-z0-9.-]+)", VALUES_ALL.read_text()))
    assert {"gpugap-worker", "gpugap-slack", "gpugap-smtp"} <= named
    for variant, objs in rendered.items():
        assert not kinds(objs, "Secret") and not kinds(objs, "ConfigMap"), variant
        for obj, c in containers(objs):
            where = f"{variant}: {obj['metadata']['name']}"
            spec = pod_spec(obj)
            files: dict[str, str] = {}  # mounted path -> Secret name
            for vol in spec.get("volumes", []):
                assert "secret" not in vol, f"{where}: secrets come in the projected volume"
                for src in vol.get("projected", {}).get("sources", []):
                    mount = next(m for m in c["volumeMounts"] if m["name"] == vol["name"])
                    assert mount["readOnly"] is True, where
                    for item in src["secret"]["items"]:
                        files[f"{mount['mountPath']}/{item['path']}"] = src["secret"]["name"]
            for env in c["env"]:
                assert "secretKeyRef" not in env.get("valueFrom", {}), f"{where}: {env['name']}"
                if SECRETISH.search(env["name"]):
                    assert env["name"].endswith(("_FILE", "CAFILE", "CERTFILE", "KEYFILE")), (
                        f"{where}: {env['name']} is a secret given as a value"
                    )
                    assert env["value"] in files, f"{where}: {env['name']} names no mounted file"
            for secret in files.values():
                assert variant == "default" or secret in named, f"{where}: Secret {secret}?"
            if variant == "default":
                assert not files, f"{where}: the defaults name no Secret"
    # every secret the values name reaches its component's pod, under its *_FILE setting
    objs = rendered["all"]
    notify = one(objs, "Deployment", "gpugap-notify")["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in notify["containers"][0]["env"]}
    assert env["GPUGAP_SLACK_WEBHOOK_URL_FILE"] == "/etc/gpugap/secrets/slack-webhook-url"
    assert env["GPUGAP_KAFKA_SASL_USERNAME"] == values["notify"]["kafkaSasl"]["username"]
    web = one(objs, "Deployment", "gpugap-web")["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in web["containers"][0]["env"]}
    assert env["GPUGAP_CLICKHOUSE_USER"] == "reader"
    sources = web["volumes"][1]["projected"]["sources"]
    assert [s["secret"]["name"] for s in sources] == ["gpugap-clickhouse-reader"]


def test_a_secret_given_as_a_value_is_refused(helm: Path) -> None:
    for setting in ("notify.env.GPUGAP_SLACK_WEBHOOK_URL=https://hooks.example/x",
                    "digest.env.GPUGAP_EMAIL_PASSWORD=hunter2"):  # fmt: skip
        proc = run_helm(
            helm, "template", RELEASE, str(CHART), "--set", "digest.enabled=true",
            "--set", setting, check=False,
        )  # fmt: skip
        assert proc.returncode != 0 and "secretFiles" in proc.stderr, proc.stderr
    proc = run_helm(
        helm, "template", RELEASE, str(CHART), "--set",
        "notify.secretFiles[0].env=GPUGAP_SLACK_WEBHOOK_URL,notify.secretFiles[0].secret=s,"
        "notify.secretFiles[0].key=url", check=False,
    )  # fmt: skip
    assert proc.returncode != 0 and "*_FILE" in proc.stderr, proc.stderr


def test_the_monthly_report_runs_on_the_first_with_the_digests_settings(
    helm: Path, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    objs = rendered["all"]
    digest = pod_spec(one(objs, "CronJob", "gpugap-digest"))["containers"][0]
    cron = one(objs, "CronJob", "gpugap-monthly-report")
    assert cron["spec"]["schedule"] == "0 7 1 * *"
    monthly = pod_spec(cron)["containers"][0]
    assert monthly["args"] == [
        "monthly-report", "--sent-by", "cronjob/gpugap-monthly-report", "--users"
    ]  # fmt: skip
    assert monthly["env"] == digest["env"] and monthly["volumeMounts"] == digest["volumeMounts"]
    names = {e["name"] for e in monthly["env"]}
    assert {"GPUGAP_MONTHLY_TEAM_ADDRESSES", "GPUGAP_EMAIL_PASSWORD_FILE"} <= names
    off = render(helm, "-f", str(VALUES_ALL), "--set", "digest.monthly.enabled=false")
    assert not [o for o in off if o["metadata"]["name"] == "gpugap-monthly-report"]
    assert [o for o in off if o["metadata"]["name"] == "gpugap-digest"]


def test_rbac_is_the_shipped_read_only_role(rendered: dict[str, list[dict[str, Any]]]) -> None:
    shipped = {
        d["kind"]: d
        for d in yaml.safe_load_all((ROOT / "deploy" / "kubernetes-producer-rbac.yaml").read_text())
        if d
    }
    for variant, objs in rendered.items():
        roles = kinds(objs, "ClusterRole") + kinds(objs, "Role")
        assert len(roles) == 1, variant
        rules = roles[0]["rules"]
        assert rules == shipped["ClusterRole"]["rules"], variant
        for rule in rules:
            assert set(rule["verbs"]) <= READ_ONLY_VERBS, rule
            assert "*" not in rule["resources"] and "*" not in rule["apiGroups"], rule
            assert "secrets" not in rule["resources"], rule
        (binding,) = kinds(objs, "ClusterRoleBinding")
        assert binding["roleRef"]["name"] == roles[0]["metadata"]["name"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "gpugap-kubernetes-producer",
             "namespace": NAMESPACE}
        ]  # fmt: skip


def test_namespaced_producer_binds_per_namespace(helm: Path) -> None:
    objs = render(helm, "--set", "kubernetesProducer.namespaces={ml,research}")
    assert not kinds(objs, "ClusterRoleBinding")
    assert {b["metadata"]["namespace"] for b in kinds(objs, "RoleBinding")} == {"ml", "research"}
    dep = one(objs, "Deployment", "gpugap-kubernetes-producer")
    env = {e["name"]: e["value"] for e in pod_spec(dep)["containers"][0]["env"]}
    assert env["GPUGAP_K8S_NAMESPACES"] == "ml,research"


def test_replicas(helm: Path, rendered: dict[str, list[dict[str, Any]]]) -> None:
    assert one(rendered["default"], "Deployment", "gpugap-worker")["spec"]["replicas"] == 2
    assert one(rendered["all"], "Deployment", "gpugap-worker")["spec"]["replicas"] == 3
    objs = render(helm, "--set", "worker.replicas=5")
    assert one(objs, "Deployment", "gpugap-worker")["spec"]["replicas"] == 5
    for objs in rendered.values():  # one of each, never two at once
        for name in ("gpugap-sink", "gpugap-notify", "gpugap-kubernetes-producer"):
            dep = one(objs, "Deployment", name)
            assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    worker = pod_spec(one(rendered["all"], "Deployment", "gpugap-worker"))["containers"][0]
    assert worker["args"][worker["args"].index("--group") + 1] == "gpugap-worker"
    text = (CHART / "values.yaml").read_text()
    assert "partition count is the ceiling on useful" in " ".join(text.split())


def test_kafka_topics_partitioned_as_the_worker_needs(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    from gpugap.groundfloor.settings import KafkaSettings
    from gpugap.schemas.topics import SAMPLES, TOPICS
    from gpugap.streams.runtime import episodes_topic, state_topic

    values = yaml.safe_load(VALUES_ALL.read_text())["kafkaTopics"]
    assert not kinds(rendered["default"], "KafkaTopic")
    for variant, prefix in (("all", ""), ("dcgm", "prod.")):
        topics = {t["spec"]["topicName"]: t for t in kinds(rendered[variant], "KafkaTopic")}
        kafka = KafkaSettings(topic_prefix=prefix)
        shared = {prefix + name for name in TOPICS}
        own = {
            f"{prefix}{cluster}.{name}"
            for cluster in values["clusters"]
            for name in ("gpu.samples.v1", "slurm.jobs.v1", "k8s.pods.v1", "transfers.v1",
                         "node-capacity.v1", "queue-quotas.v1", "scheduler-gpu-counts.v1",
                         "dead-letter.v1")
        }  # fmt: skip
        group = {episodes_topic(kafka, "gpugap-worker"), state_topic(kafka, "gpugap-worker")}
        assert set(topics) == shared | own | group, variant
        split = (
            {prefix + SAMPLES.name}
            | group
            | {f"{prefix}{c}.{SAMPLES.name}" for c in values["clusters"]}
        )
        for name, t in topics.items():
            want = values["samplesPartitions"] if name in split else values["partitions"]
            assert t["spec"]["partitions"] == want, name
            assert t["spec"]["replicas"] == values["replicas"], name
            assert t["metadata"]["labels"]["strimzi.io/cluster"] == "gpugap"
            assert t["spec"]["config"]["retention.ms"] == "-1"
        assert topics[state_topic(kafka, "gpugap-worker")]["spec"]["config"]["cleanup.policy"] == (
            "compact"
        )


def test_monitoring_objects(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["all"]
    (rule,) = kinds(objs, "PrometheusRule")
    shipped = yaml.safe_load((ROOT / "deploy" / "prometheus" / "gpugap-rules.yaml").read_text())
    assert rule["spec"] == shipped["spec"]  # files/gpugap-rules.yaml is the shipped file
    (monitor,) = kinds(objs, "ServiceMonitor")
    service = one(objs, "Service", "gpugap-web")
    labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    # the workers' own /metrics: selected by their pods' labels, on the port they serve
    (pods,) = kinds(objs, "PodMonitor")
    worker = one(objs, "Deployment", "gpugap-worker")
    template = worker["spec"]["template"]
    selector = pods["spec"]["selector"]["matchLabels"]
    assert selector.items() <= template["metadata"]["labels"].items()
    assert selector.items() <= worker["spec"]["selector"]["matchLabels"].items()
    (container,) = template["spec"]["containers"]
    endpoint = pods["spec"]["podMetricsEndpoints"][0]
    assert endpoint["port"] in {p["name"] for p in container["ports"]}
    assert endpoint["path"] == "/metrics" and pods["metadata"]["labels"]["release"] == "prometheus"
    assert not kinds(rendered["default"], "PodMonitor")  # off unless asked for


# --- server-side dry-run against a real kube-apiserver ------------------------------------------


@pytest.fixture(scope="module")
def cluster(kube: Any) -> Iterator[Any]:
    """The session's kube-apiserver (tests/conftest.py), with the vendored CRDs installed for
    real and the namespaces and Secrets that values-all.yaml names created."""
    from tests.harness.kube_apiserver import ApiError

    server = kube
    for path in sorted(CRDS.glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if crd:
                server.apply(crd)
    for path in sorted(CRDS.glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if crd:
                _wait_established(server, crd)
    for ns in (NAMESPACE, "ml", "research"):  # the producer's tests made NAMESPACE already
        with contextlib.suppress(ApiError):
            server.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    for name in set(re.findall(r"(?:name|secret): ([a-z0-9.-]+)", VALUES_ALL.read_text())):
        server.admin.post(
            f"/api/v1/namespaces/{NAMESPACE}/secrets",
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
             "stringData": {"password": "x", "url": "x", "token": "x", "ca.crt": "x"}},
        )  # fmt: skip
    yield server


def _wait_established(server: Any, crd: dict[str, Any], timeout: float = 60) -> None:
    name = crd["metadata"]["name"]
    group, version = crd["spec"]["group"], crd["spec"]["versions"][0]["name"]
    deadline = time.monotonic() + timeout
    while True:
        got = server.admin.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conditions = {c["type"]: c["status"] for c in got.get("status", {}).get("conditions", [])}
        if conditions.get("Established") == "True":
            with contextlib.suppress(Exception):
                found = server.admin.get(f"/apis/{group}/{version}")
                if any(r["name"] == crd["spec"]["names"]["plural"] for r in found["resources"]):
                    return
        assert time.monotonic() < deadline, f"CRD {name} not established: {conditions}"
        time.sleep(0.2)


def _resources(server: Any) -> dict[tuple[str, str], tuple[str, bool]]:
    """(apiVersion, kind) -> (plural, namespaced), from the apiserver's discovery."""
    out: dict[tuple[str, str], tuple[str, bool]] = {}
    versions = ["v1"]
    for g in server.admin.get("/apis")["groups"]:
        versions += [v["groupVersion"] for v in g["versions"]]
    for gv in versions:
        doc = server.admin.get("/api/v1" if gv == "v1" else f"/apis/{gv}")
        for r in doc["resources"]:
            if "/" not in r["name"]:
                out[(gv, r["kind"])] = (r["name"], r["namespaced"])
    return out


def dry_run_apply(server: Any, objs: list[dict[str, Any]]) -> list[str]:
    """Server-side apply of each object with dryRun=All; the server's message for each refusal."""
    from tests.harness.kube_apiserver import ApiError

    resources = _resources(server)
    problems = []
    for obj in objs:
        what = f"{obj['kind']}/{obj['metadata']['name']}"
        key = (obj["apiVersion"], obj["kind"])
        if key not in resources:
            problems.append(f"{what}: the apiserver serves no {key}")
            continue
        plural, namespaced = resources[key]
        base = "/api/v1" if obj["apiVersion"] == "v1" else f"/apis/{obj['apiVersion']}"
        ns = obj["metadata"].get("namespace")
        if namespaced != bool(ns):
            problems.append(f"{what}: namespace {ns!r}, but namespaced={namespaced}")
            continue
        path = f"{base}/namespaces/{ns}/{plural}" if namespaced else f"{base}/{plural}"
        query = urllib.parse.urlencode(
            {"dryRun": "All", "fieldManager": "gpugap-chart-test", "force": "true",
             "fieldValidation": "Strict"}
        )  # fmt: skip
        try:
            got = server.admin.call(
                "PATCH", f"{path}/{obj['metadata']['name']}?{query}",
                json.dumps(obj).encode(), content_type="application/apply-patch+yaml",
            )  # fmt: skip
        except ApiError as exc:
            message = exc.body.get("message") if isinstance(exc.body, dict) else exc.body
            problems.append(f"{what}: HTTP {exc.code}: {message}")
            continue
        if got["kind"] != obj["kind"] or got["metadata"]["name"] != obj["metadata"]["name"]:
            problems.append(f"{what}: the server answered with {got['kind']}")
    return problems


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_object_passes_server_side_dry_run(
    cluster: Any, rendered: dict[str, list[dict[str, Any]]], variant: str
) -> None:
    objs = rendered[variant]
    problems = dry_run_apply(cluster, objs)
    assert not problems, f"{variant}: the apiserver refused:\n" + "\n".join(problems)
    # dry run: nothing was stored
    deployments = cluster.admin.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments")
    assert deployments["items"] == []


def test_a_refusal_fails_with_the_servers_message(cluster: Any, helm: Path) -> None:
    objs = render(helm, "-f", str(VALUES_ALL))
    (topic,) = [t for t in kinds(objs, "KafkaTopic") if t["spec"]["topicName"] == "alerts.v1"]
    topic["spec"]["partitions"] = 0  # the real CRD's schema says minimum 1
    (worker,) = [d for d in kinds(objs, "Deployment") if d["metadata"]["name"] == "gpugap-worker"]
    worker["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsNonRoot"] = "yes"
    problems = dry_run_apply(cluster, [topic, worker])
    assert len(problems) == 2, problems
    assert (
        "spec.partitions" in problems[0] and "should be greater than or equal to 1" in (problems[0])
    ), problems[0]
    assert "runAsNonRoot" in problems[1], problems[1]
