"""deploy/kubernetes: every manifest passes the Kubernetes schema, and its commands are real.

The schema check is kubernetes-validate's (the API's own OpenAPI schemas,
bundled, strict: unknown fields are errors), so no cluster is needed. The
commands are parsed with the launcher's and the orchestrator's own parsers,
so a renamed flag breaks this test, not a user's job.
"""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml

from tensorflow_elastic import environment
from tensorflow_elastic.launch import launcher
from tensorflow_elastic.launch.spec import parse_nnodes
from tensorflow_elastic.rendezvous import cli as orchestrator_cli

KUBERNETES_VERSION = "1.33.0"  # the oldest release the manifests are meant for
TOKEN_SECRET = "tfelastic-token"


def validate(resource: dict) -> None:
    kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


def container(workload: dict) -> dict:
    (only,) = workload["spec"]["template"]["spec"]["containers"]
    return only


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """The container's arguments as the kubelet passes them ($(VAR) from the container's env)."""
    for name, value in env.items():
        args = [a.replace(f"$({name})", value) for a in args]
    return args


def mount_of(workload: dict, volume_source: str, name: str) -> str:
    """Where the container mounts the volume made from ``volume_source`` ``name``."""
    pod = workload["spec"]["template"]["spec"]
    volume = next(v["name"] for v in pod["volumes"]
                  if name in (v.get(volume_source) or {}).values())
    return next(m["mountPath"] for m in container(workload)["volumeMounts"] if m["name"] == volume)


def test_every_manifest_passes_the_kubernetes_schema(manifest_file, load_manifest):
    docs = load_manifest(manifest_file)
    assert docs
    for doc in docs:
        validate(doc)


def _break_replicas(doc: dict) -> None:
    doc["spec"]["replicas"] = "two"


def _misspell_a_field(doc: dict) -> None:
    container(doc)["terminationGracePeriod"] = 90


def _drop_the_selector(doc: dict) -> None:
    del doc["spec"]["selector"]


@pytest.mark.parametrize("breakage", [_break_replicas, _misspell_a_field, _drop_the_selector])
def test_a_broken_copy_is_rejected(resource, breakage):
    broken = resource("StatefulSet", "tfelastic-worker")
    validate(broken)
    breakage(broken)
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(broken)


def test_a_copy_that_is_not_yaml_is_rejected(manifests_dir, load_manifest, tmp_path):
    text = (manifests_dir / "workers.yaml").read_text()
    assert "\n  replicas: 2\n" in text
    (tmp_path / "workers.yaml").write_text(text.replace("\n  replicas: 2\n", "\n\treplicas: 2\n"))
    with pytest.raises(yaml.YAMLError):
        load_manifest(tmp_path / "workers.yaml")


def test_workers_run_the_launcher_with_flags_it_knows(resource):
    workers = resource("StatefulSet", "tfelastic-worker")
    worker = container(workers)
    pod_ip = next(e for e in worker["env"] if e["name"] == "POD_IP")
    assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert "--address=$(POD_IP):2222" in worker["args"]

    args = launcher.build_parser().parse_args(expand(worker["args"], {"POD_IP": "10.0.0.7"}))
    service = resource("Service", "tfelastic-orchestrator")
    port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "rendezvous")
    assert args.rdzv_endpoint == f"tfelastic-orchestrator:{port}"
    assert args.address == "10.0.0.7:2222"
    # --nnodes counts pods: the starting replicas must fit its bounds.
    bounds = parse_nnodes(args.nnodes)
    assert bounds.min_nodes <= workers["spec"]["replicas"] <= bounds.max_nodes
    # A preempted worker must leave before the kubelet's SIGKILL.
    assert args.stop_timeout < workers["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert args.token_file.startswith(mount_of(workers, "secret", TOKEN_SECRET) + "/")


def test_the_worker_command_runs_the_entrypoint_from_the_config_map(resource):
    workers = resource("StatefulSet", "tfelastic-worker")
    entrypoint = resource("ConfigMap", "tfelastic-worker-entrypoint")
    mount = mount_of(workers, "configMap", entrypoint["metadata"]["name"])
    assert container(workers)["command"] == ["/bin/sh", f"{mount}/run-worker.sh"]
    assert "run-worker.sh" in entrypoint["data"]


def test_the_orchestrator_keeps_its_state_on_the_claim_and_its_token_in_the_secret(resource):
    deployment = resource("Deployment", "tfelastic-orchestrator")
    orchestrator = container(deployment)
    assert orchestrator["command"] == ["tfelastic-orchestrator"]
    args = orchestrator_cli.build_parser().parse_args(orchestrator["args"])
    claim = resource("PersistentVolumeClaim", "tfelastic-orchestrator-state")
    assert args.state_dir == mount_of(deployment, "persistentVolumeClaim", claim["metadata"]["name"])
    assert args.token_file.startswith(mount_of(deployment, "secret", TOKEN_SECRET) + "/")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    ports = {p["containerPort"] for p in orchestrator["ports"]}
    assert args.port in ports and orchestrator["readinessProbe"]["grpc"]["port"] == args.port
    # The orchestrator serves on every interface with a token; its metrics must too, or
    # the Service that scrapes the pod's address reaches nothing.
    assert args.host == "0.0.0.0" and args.metrics_port in ports
    assert args.metrics_host == "0.0.0.0"


def test_no_manifest_carries_a_token(manifest_file, load_manifest):
    for doc in load_manifest(manifest_file):
        assert doc["kind"] != "Secret", "create the token with kubectl, not in a manifest"
        template = doc.get("spec", {}).get("template", {}).get("spec", {})
        for c in template.get("containers", []):
            literal = [e for e in c.get("env", []) if e["name"] == environment.TOKEN and "value" in e]
            assert not literal, f"{c['name']}: ${environment.TOKEN} must come from the Secret"


def test_the_job_form_completes_its_pods_and_scales_within_the_bounds(resource):
    job = resource("Job", "tfelastic-worker")
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["completionMode"] == "Indexed"
    # An elastic Indexed Job changes completions and parallelism together.
    assert spec["completions"] == spec["parallelism"]
    worker = container(job)
    assert worker["command"] == ["tfelastic-run"]  # the pod ends with the launcher's code
    args = launcher.build_parser().parse_args(expand(worker["args"], {"POD_IP": "10.0.0.7"}))
    bounds = parse_nnodes(args.nnodes)
    assert bounds.min_nodes <= spec["parallelism"] <= bounds.max_nodes
    assert args.address == "10.0.0.7:2222"
    assert args.stop_timeout < pod["terminationGracePeriodSeconds"]
    assert args.token_file.startswith(mount_of(job, "secret", TOKEN_SECRET) + "/")
    # A bad argument (exit 2) fails the Job instead of being replaced backoffLimit times.
    assert pod["restartPolicy"] == "Never"
    fail_job = next(r for r in spec["podFailurePolicy"]["rules"] if r["action"] == "FailJob")
    assert fail_job["onExitCodes"] == {"containerName": worker["name"], "operator": "In",
                                       "values": [2]}
    # Its pods are not the StatefulSet's.
    statefulset = resource("StatefulSet", "tfelastic-worker")
    assert (job["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
            != statefulset["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"])


def _pod_labels(workload: dict) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"]["labels"]


def _selects(selector: dict, labels: dict[str, str]) -> bool:
    return selector["matchLabels"].items() <= labels.items()


@pytest.mark.parametrize("kind, name", [("StatefulSet", "tfelastic-worker"),
                                        ("Job", "tfelastic-job-worker")])
def test_only_the_job_s_pods_reach_the_workers_tensorflow_servers(resource, kind, name):
    """The TensorFlow servers take no token: their port is open to the job's pods alone, in
    either form of the workers."""
    workers = resource(kind, "tfelastic-worker")
    orchestrator = resource("Deployment", "tfelastic-orchestrator")
    policy = resource("NetworkPolicy", name)
    assert _selects(policy["spec"]["podSelector"], _pod_labels(workers))
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    args = launcher.build_parser().parse_args(expand(container(workers)["args"],
                                                     {"POD_IP": "10.0.0.7"}))
    assert [p["port"] for p in rule["ports"]] == [int(args.address.rpartition(":")[2])]
    sources = [peer["podSelector"] for peer in rule["from"]]
    assert all(set(peer) == {"podSelector"} for peer in rule["from"])  # no namespace, no CIDR
    assert any(_selects(s, _pod_labels(workers)) for s in sources)
    assert any(_selects(s, _pod_labels(orchestrator)) for s in sources)  # its probes
    assert not any(_selects(s, {"app.kubernetes.io/name": "other"}) for s in sources)


def test_the_orchestrator_s_port_is_for_the_job_s_pods_and_its_metrics_for_monitoring(resource):
    workers = resource("StatefulSet", "tfelastic-worker")
    deployment = resource("Deployment", "tfelastic-orchestrator")
    policy = resource("NetworkPolicy", "tfelastic-orchestrator")
    assert _selects(policy["spec"]["podSelector"], _pod_labels(deployment))
    args = orchestrator_cli.build_parser().parse_args(container(deployment)["args"])
    by_port = {p["port"]: rule["from"] for rule in policy["spec"]["ingress"]
               for p in rule["ports"]}
    assert set(by_port) == {args.port, args.metrics_port}
    (job_pods,) = by_port[args.port]
    assert _selects(job_pods["podSelector"], _pod_labels(workers))
    (monitoring,) = by_port[args.metrics_port]
    assert set(monitoring) == {"namespaceSelector"}
