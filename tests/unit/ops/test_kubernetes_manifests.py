"""deploy/kubernetes: every manifest validates offline against the Kubernetes API schemas
(kubernetes-validate, strict: unknown fields refused) of the oldest and the newest version the
manifests support, and the pieces hold together: each daemon container's flags parse with the
daemon's own parser and config reader, its probes are gRPC on its own health port (startup and
readiness on the board's service "", liveness on `calculet.liveness`), it mounts its runtime
directory (board locks, and calsim's device locks by default), device, models and TLS files; the
gateway's `--dns` names are the headless Service's name and ports, its workers have the CPU they
need; pods outlast their preStop sleep plus the drain; the PDB selects the gateway. Last, the
gateway's discovery turns one headless name given once per board port into one board per pod
address and port, as it would in a cluster (a hosts file stands in for DNS).

No kustomize binary here: `manifests()` reads the kustomization's resources and builds its
ConfigMap generator's output itself (namespace set, no hash suffix).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from calculet.daemon import settings as daemon_flags
from calculet.daemon.calsim.device_lock import STATE_DIR_ENV
from calculet.daemon.runtime_paths import APP_DIR, RUN_ROOT
from calculet.daemon.server.liveness import LIVENESS_SERVICE
from calculet.gateway import main as gateway_main
from calculet.gateway.config import config_from as gateway_config_from
from calculet.gateway.fleet.discovery import Discovery, HostsFileResolver, split_host_port
from calculet.gateway.workers.supervisor import STOP_GRACE_S

DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "kubernetes"
# 1.30: the oldest release whose preStop `sleep` action is on by default; 1.37: the newest schema.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
CLUSTER_DOMAIN = "svc.cluster.local"
DNS_TTL_S = 5  # CoreDNS's default TTL for cluster names
STOP_MARGIN_S = 10  # after the drain: in-band Finals, gRPC stop grace (2 s), device close
# Daemon flags the manifests pass that the daemon does not have yet (the TLS work of issue 10):
# allowed while the daemon knows none of a group; once it knows one, it must know the whole group.
PENDING_DAEMON_FLAGS = (
    ("--tls-cert", "--tls-key", "--tls-client-ca"),
    ("--health-listen",),
)

Manifest = dict[str, Any]


def load_yaml(name: str) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / name).read_text(encoding="utf-8")) if doc]


def kustomization() -> Manifest:
    (doc,) = load_yaml("kustomization.yaml")
    return doc


def manifests() -> list[Manifest]:
    """What `kubectl apply -k` applies: the resources, the generated ConfigMaps, the namespace."""
    k = kustomization()
    docs = [doc for name in k["resources"] for doc in load_yaml(name)]
    for gen in k.get("configMapGenerator", []):
        data = {Path(f).name: (DEPLOY / f).read_text(encoding="utf-8") for f in gen["files"]}
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]}, "data": data})
    for doc in docs:
        if doc["kind"] != "Namespace":
            doc["metadata"]["namespace"] = k["namespace"]
    return docs


def one(kind: str, name: str | None = None) -> Manifest:
    (doc,) = [d for d in manifests() if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    return doc


def pod_specs() -> Iterator[tuple[str, Manifest]]:
    for doc in manifests():
        if doc["kind"] in ("DaemonSet", "Deployment", "StatefulSet", "Job"):
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def selects(selector: Manifest, labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # no matchExpressions to evaluate here
    return selector["matchLabels"].items() <= labels.items()


def flag_values(args: list[str], *flags: str) -> dict[str, list[str]]:
    """Every value given to each of `flags` (`--flag=value` or `--flag value`)."""
    found: dict[str, list[str]] = {f: [] for f in flags}
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in found:
            found[name].append(value if eq else args[i + 1])
    return found


def daemon_knows(flag: str) -> bool:
    _, rest = daemon_flags.build_parser().parse_known_args([f"{flag}=x"])
    return not rest


def port_of(target: str) -> int:
    return split_host_port(target)[1]


def mounts(container: Manifest) -> dict[str, Manifest]:
    return {m["mountPath"]: m for m in container.get("volumeMounts", [])}


def volumes(spec: Manifest) -> dict[str, Manifest]:
    return {v["name"]: v for v in spec.get("volumes", [])}


def mounted_under(container: Manifest, path: str) -> Manifest:
    """The mount that holds `path` (the deepest one)."""
    holders = [m for p, m in mounts(container).items() if path == p or path.startswith(p.rstrip("/") + "/")]
    assert holders, f"{container['name']}: nothing mounted at {path}"
    return max(holders, key=lambda m: len(m["mountPath"]))


def daemon_containers() -> list[Manifest]:
    return one("DaemonSet")["spec"]["template"]["spec"]["containers"]


def gateway_container() -> Manifest:
    (container,) = one("Deployment", "calculet-gateway")["spec"]["template"]["spec"]["containers"]
    return container


def daemon_settings(container: Manifest) -> dict[str, Any]:
    """The container's settings as the daemon merges them (its config file: the repo's copy)."""
    args = [a for a in container["args"] if a.split("=", 1)[0] not in sum(PENDING_DAEMON_FLAGS, ())]
    config = flag_values(args, "--config")["--config"]
    assert config == ["/etc/calculet/daemon.toml"], config
    generated = {Path(f).name: DEPLOY / f for g in kustomization()["configMapGenerator"] for f in g["files"]}
    local = [a.replace(config[0], str(generated["daemon.toml"])) if a.startswith("--config") else a for a in args]
    return daemon_flags.merged_settings(daemon_flags.build_parser().parse_args(local))


def gateway_args() -> argparse.Namespace:
    return gateway_main.build_parser().parse_args(gateway_container()["args"])


# ---------------------------------------------------------------------------------------- schema


def test_kustomization_lists_every_manifest() -> None:
    k = kustomization()
    on_disk = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(k["resources"]) == on_disk
    for gen in k["configMapGenerator"]:
        assert all((DEPLOY / f).is_file() for f in gen["files"])
    kinds = sorted(d["kind"] for d in manifests())
    assert kinds == ["ConfigMap", "DaemonSet", "Deployment", "Namespace", "PodDisruptionBudget", "Service", "Service"]
    (namespace,) = [d for d in manifests() if d["kind"] == "Namespace"]
    assert namespace["metadata"]["name"] == k["namespace"] == "calculet"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_validates(version: str) -> None:
    for doc in manifests():
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_validation_refuses_a_misspelled_field() -> None:
    daemonset = copy.deepcopy(one("DaemonSet"))
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, KUBERNETES_VERSIONS[-1], strict=True)


# ---------------------------------------------------------------------------------------- daemons


def test_daemon_flags_parse_and_the_config_is_accepted() -> None:
    for container in daemon_containers():
        _, rest = daemon_flags.build_parser().parse_known_args(container["args"])
        for group in PENDING_DAEMON_FLAGS:
            known = [daemon_knows(f) for f in group]
            assert all(known) or not any(known), f"the daemon has only some of {group}"
        pending = {f for group in PENDING_DAEMON_FLAGS for f in group if not daemon_knows(f)}
        assert {a.split("=", 1)[0] for a in rest} <= pending, rest
        settings = daemon_settings(container)
        config = daemon_flags.config_from(settings)
        assert container["name"] == f"board{config.board}"
        assert config.device_options["profile"] == "calrt-0.7.6"
        assert settings["listen"] == f"0.0.0.0:{50050 + config.board}"
        assert daemon_flags.runtime_dir(settings) == Path("/run/calculet")
    boards = [daemon_flags.config_from(daemon_settings(c)).board for c in daemon_containers()]
    assert sorted(boards) == list(range(len(boards))) and len(boards) >= 2


def test_daemon_probes_are_grpc_on_the_containers_own_health_port() -> None:
    for container in daemon_containers():
        (health,) = flag_values(container["args"], "--health-listen")["--health-listen"]
        (listen,) = flag_values(container["args"], "--listen")["--listen"]
        ports = {p["containerPort"] for p in container["ports"]}
        assert {port_of(health), port_of(listen)} == ports
        # Service "" is the board's readiness (NOT_SERVING when drained, past its reset budget or
        # without a Ready model); liveness asks for the daemon's liveness service, which stays
        # SERVING through all of those, so a drained board is never restarted.
        services = {"startupProbe": None, "readinessProbe": None, "livenessProbe": LIVENESS_SERVICE}
        for kind, service in services.items():
            probe = container[kind]
            assert set(probe) - {"periodSeconds", "timeoutSeconds", "failureThreshold", "initialDelaySeconds"} == {
                "grpc"
            }, (container["name"], kind)
            expected = {"port": port_of(health)} | ({"service": service} if service else {})
            assert probe["grpc"] == expected, (container["name"], kind)


def test_daemons_mount_config_runtime_dir_device_models_and_tls() -> None:
    spec = one("DaemonSet")["spec"]["template"]["spec"]
    vols = volumes(spec)
    generated = {g["name"] for g in kustomization()["configMapGenerator"]}
    for container in daemon_containers():
        settings = daemon_settings(container)
        config = daemon_flags.config_from(settings)
        board = config.board
        # The config file: from the generated ConfigMap.
        config_mount = mounted_under(container, "/etc/calculet/daemon.toml")
        assert vols[config_mount["name"]]["configMap"]["name"] in generated
        assert config_mount.get("subPath") == "daemon.toml" and config_mount["readOnly"]
        # The runtime directory: an emptyDir, writable, shared by the pod's daemons.
        runtime = mounts(container)[str(daemon_flags.runtime_dir(settings))]
        assert "emptyDir" in vols[runtime["name"]] and not runtime.get("readOnly", False)
        # calsim's device locks go to <the host's default runtime dir>/calsim: with no variable moving
        # it, that is /run/calculet (writable), the same emptyDir.
        env = {e["name"] for e in container.get("env", [])}
        assert env.isdisjoint({"RUNTIME_DIRECTORY", "XDG_RUNTIME_DIR", STATE_DIR_ENV}), env
        assert daemon_flags.runtime_dir(settings) == RUN_ROOT / APP_DIR
        # The board's device node, and no other board's.
        device = mounts(container)[f"/dev/calculet{board}"]
        assert vols[device["name"]]["hostPath"]["path"] == f"/dev/calculet{board}"
        assert [p for p in mounts(container) if p.startswith("/dev/")] == [f"/dev/calculet{board}"]
        # Models, read-only, at the models root.
        models = mounts(container)[str(config.models_root)]
        assert models["readOnly"] and (
            "hostPath" in vols[models["name"]] or "persistentVolumeClaim" in vols[models["name"]]
        )
        # Every TLS file from the daemons' Secret.
        tls = flag_values(container["args"], "--tls-cert", "--tls-key", "--tls-client-ca")
        for flag, values in tls.items():
            (path,) = values
            mount = mounted_under(container, path)
            secret = vols[mount["name"]]["secret"]
            assert secret["secretName"] == "calculet-daemon-tls", flag
            assert Path(path).name in ("tls.crt", "tls.key", "ca.crt"), flag
    shared = {mounted_under(c, "/run/calculet")["name"] for c in daemon_containers()}
    assert len(shared) == 1  # one lock directory: a duplicated --board in the pod exits with status 3


def test_drain_fits_in_the_termination_grace_period() -> None:
    spec = one("DaemonSet")["spec"]["template"]["spec"]
    dns_interval = gateway_config_from(gateway_main.settings_from(gateway_args())).dns_interval_s
    for container in daemon_containers():
        drain = daemon_flags.config_from(daemon_settings(container)).drain_timeout_s
        sleep = container["lifecycle"]["preStop"]["sleep"]["seconds"]
        assert sleep >= dns_interval + DNS_TTL_S, "the gateways must re-resolve before the daemon drains"
        assert spec["terminationGracePeriodSeconds"] >= sleep + drain + STOP_MARGIN_S > drain
    gateway_spec = one("Deployment", "calculet-gateway")["spec"]["template"]["spec"]
    cfg = gateway_config_from(gateway_main.settings_from(gateway_args()))
    graceful = gateway_main.uvicorn_config(cfg).timeout_graceful_shutdown
    sleep = gateway_container()["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert gateway_spec["terminationGracePeriodSeconds"] > sleep + graceful
    if cfg.workers > 1:  # the supervisor's wait for its workers, before it kills them
        assert gateway_spec["terminationGracePeriodSeconds"] > sleep + STOP_GRACE_S > sleep + graceful


# ---------------------------------------------------------------------------------------- discovery


def test_gateway_dns_names_are_the_headless_services_name_and_ports() -> None:
    service = one("Service", "calculet-daemons")
    assert service["spec"]["clusterIP"] == "None"
    daemonset = one("DaemonSet")
    assert selects({"matchLabels": service["spec"]["selector"]}, daemonset["spec"]["template"]["metadata"]["labels"])
    fqdn = f"{service['metadata']['name']}.{service['metadata']['namespace']}.{CLUSTER_DOMAIN}"
    expected = {f"{fqdn}:{p['port']}" for p in service["spec"]["ports"]}
    cfg = gateway_config_from(gateway_main.settings_from(gateway_args()))
    assert set(cfg.dns) == expected and len(cfg.dns) == len(expected) and not cfg.daemons
    # One Service port per board, reaching that board's daemon on its --listen port.
    listens = sorted(port_of(daemon_settings(c)["listen"]) for c in daemon_containers())
    assert sorted(p["targetPort"] for p in service["spec"]["ports"]) == listens
    assert sorted(p["port"] for p in service["spec"]["ports"]) == listens
    assert all(p.get("appProtocol") == "grpc" for p in service["spec"]["ports"])


def test_discovery_resolves_a_headless_name_per_board_port(tmp_path: Path) -> None:
    """Each address of the name is a daemon pod; each `--dns NAME:PORT` one of its boards."""
    cfg = gateway_config_from(gateway_main.settings_from(gateway_args()))
    (name,) = {split_host_port(d)[0] for d in cfg.dns}
    ports = sorted(split_host_port(d)[1] for d in cfg.dns)
    hosts = tmp_path / "hosts"
    pods = ["127.0.0.11", "127.0.0.12", "127.0.0.13"]
    hosts.write_text("".join(f"{ip} {name}\n" for ip in pods) + "127.0.0.99 calculet-gateway.example\n")
    discovery = Discovery([], cfg.dns, HostsFileResolver(hosts))

    async def scenario() -> None:
        assert sorted(await discovery.targets()) == sorted(f"{ip}:{port}" for ip in pods for port in ports)
        # A pod leaves the Service (deleted, or not ready): both of its boards leave the fleet.
        hosts.write_text(f"{pods[0]} {name}\n{pods[2]} {name}\n")
        assert sorted(await discovery.targets()) == sorted(f"{ip}:{port}" for ip in pods[::2] for port in ports)
        # A failed lookup keeps what each name:port had.
        hosts.unlink()
        assert sorted(await discovery.targets()) == sorted(f"{ip}:{port}" for ip in pods[::2] for port in ports)

    asyncio.run(scenario())


# ---------------------------------------------------------------------------------------- gateway


def test_rolling_updates_and_the_gateway_disruption_budget() -> None:
    rolling = one("DaemonSet")["spec"]["updateStrategy"]
    assert rolling == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
    gateway = one("Deployment", "calculet-gateway")
    gateway_labels = gateway["spec"]["template"]["metadata"]["labels"]
    daemon_labels = one("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    pdb = one("PodDisruptionBudget")
    assert selects(pdb["spec"]["selector"], gateway_labels)
    assert not selects(pdb["spec"]["selector"], daemon_labels)
    assert 1 <= pdb["spec"]["minAvailable"] < gateway["spec"]["replicas"]
    assert selects(gateway["spec"]["selector"], gateway_labels)


def test_gateway_service_serves_the_openai_api_on_8000() -> None:
    service = one("Service", "calculet-gateway")
    container = gateway_container()
    assert selects(
        {"matchLabels": service["spec"]["selector"]}, one("Deployment")["spec"]["template"]["metadata"]["labels"]
    )
    (port,) = service["spec"]["ports"]
    (http,) = [p for p in container["ports"] if p["name"] == port["targetPort"]]
    cfg = gateway_config_from(gateway_main.settings_from(gateway_args()))
    assert port["port"] == 8000 and http["containerPort"] == port_of(cfg.listen) == 8000
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}


def cores(quantity: str | int | float) -> float:
    """A Kubernetes CPU quantity in cores ("500m", "1", 2)."""
    text = str(quantity)
    return int(text.removesuffix("m")) / 1000 if text.endswith("m") else float(text)


def test_gateway_workers_match_the_cpu_given() -> None:
    """Several workers (one process per core), a CPU request of at least half a core each and a limit
    of a core each, so the workers are not throttled onto one core's time."""
    cfg = gateway_config_from(gateway_main.settings_from(gateway_args()))
    resources = gateway_container()["resources"]
    assert cfg.workers >= 2
    assert cores(resources["requests"]["cpu"]) >= cfg.workers * 0.5
    assert cores(resources["limits"]["cpu"]) >= cfg.workers


def test_every_pod_is_locked_down() -> None:
    for name, spec in pod_specs():
        pod = spec.get("securityContext", {})
        assert spec.get("automountServiceAccountToken") is False, name
        assert pod.get("seccompProfile") == {"type": "RuntimeDefault"}, name
        for container in spec["containers"] + spec.get("initContainers", []):
            where = f"{name}/{container['name']}"
            sc = container["securityContext"]
            assert sc.get("runAsNonRoot", pod.get("runAsNonRoot")) is True, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"] == {"drop": ["ALL"]}, where
            assert not sc.get("privileged", False), where
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][bound]), (where, bound)
            # A read-only root: whatever is written goes to a volume (/tmp at least).
            assert "/tmp" in mounts(container), where
