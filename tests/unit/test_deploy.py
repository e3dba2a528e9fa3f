"""The deployment files say what production needs: checked without a Docker engine (none
runs here), by reading them as the engine would."""

from __future__ import annotations

import re
import shlex
from typing import Any

import yaml

from service.storage import rkeys
from tests.conftest import ROOT

DEPLOY = ROOT / "deploy"


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            rows.append((word.upper(), rest.strip()))
    return rows


def test_image_installs_the_client_distribution_it_depends_on() -> None:
    """Caught: the image copied neither client/ nor installed it, and privrelease-client is not
    on a registry, so `pip install .` in the build failed."""
    rows = _dockerfile()
    copied = [shlex.split(args)[0] for word, args in rows if word == "COPY"]
    for source in copied:
        assert (ROOT / source).exists(), source
    assert "client" in copied
    install = next(args for word, args in rows if word == "RUN" and "pip install" in args)
    words = shlex.split(install.split("&&")[0])
    assert words.index("./client") < words.index(".")


def test_data_volume_is_writable_by_the_service_user() -> None:
    """Caught: the data directory did not exist in the image, so the volume mounted there was
    root-owned and every upload answered 500 PermissionError."""
    rows = _dockerfile()
    user = next(args for word, args in rows if word == "USER")
    env = " ".join(args for word, args in rows if word == "ENV")
    data_dir = re.search(r"PRIVRELEASE_DATA_DIR=(\S+)", env)
    assert data_dir is not None
    made = [args for word, args in rows if word == "RUN" and "install -d" in args]
    assert made and f"--uid {user} " in made[0]
    assert f"install -d -o privrelease -g privrelease -m 0750 {data_dir.group(1)}" in made[0]
    assert [w for w, _ in rows].index("USER") > [w for w, _ in rows].index("RUN")


def _compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return doc


def test_compose_services_restart_and_report_health() -> None:
    services = _compose()["services"]
    assert set(services) == {"postgres", "valkey", "api", "worker"}
    for name, svc in services.items():
        assert svc["restart"] == "unless-stopped", name
        assert svc["healthcheck"]["test"], name
    for name in ("api", "worker"):
        for needed in ("postgres", "valkey"):
            assert services[name]["depends_on"][needed]["condition"] == "service_healthy"
    assert services["worker"]["healthcheck"]["test"][-1] == "--healthcheck"


def test_compose_valkey_requires_the_service_password() -> None:
    services = _compose()["services"]
    assert "./users.acl:/etc/valkey/users.acl:ro" in services["valkey"]["volumes"]
    url = services["api"]["environment"]["PRIVRELEASE_REDIS_URL"]
    assert url.startswith("redis://privrelease:${VALKEY_PASSWORD:?")
    conf = (DEPLOY / "valkey.conf").read_text().splitlines()
    assert "protected-mode yes" in conf and "aclfile /etc/valkey/users.acl" in conf
    assert (DEPLOY / "users.acl.example").read_text().startswith("user default off\n")
    assert "deploy/users.acl" in (ROOT / ".gitignore").read_text().splitlines()


def test_valkey_conf_has_no_inline_comments() -> None:
    """Valkey rejects `directive value # comment` (a crash loop at start): caught once here."""
    for line in (DEPLOY / "valkey.conf").read_text().splitlines():
        assert line.startswith("#") or "#" not in line, line


def test_every_path_in_the_deploy_folder_is_documented() -> None:
    """In the manual's page on running the service (it was the README's "Running it")."""
    page = (ROOT / "docs" / "guides" / "running.md").read_text()
    for name in ("compose.yaml", "valkey.conf", "users.acl.example", "Dockerfile"):
        assert f"deploy/{name}" in page or f"`{name}`" in page, name


def test_kubernetes_manifests_validate() -> None:
    """Every manifest against the Kubernetes schemas (strict: unknown fields fail)."""
    import kubernetes_validate

    k8s = DEPLOY / "k8s"
    listed = yaml.safe_load((k8s / "kustomization.yaml").read_text())["resources"]
    manifests = sorted(p.name for p in k8s.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted([*listed, "secret.example.yaml"]) == manifests
    kinds = set()
    for name in manifests:
        for doc in yaml.safe_load_all((k8s / name).read_text()):
            kubernetes_validate.validate(doc, "1.30", strict=True)
            kinds.add((doc["kind"], doc["metadata"]["name"]))
    assert {("Deployment", "privrelease-api"), ("Deployment", "privrelease-worker"),
            ("StatefulSet", "valkey")} <= kinds
    # nothing shared between pods but the database, the broker and the object store
    assert not any(kind == "PersistentVolumeClaim" for kind, _ in kinds)


def test_kubernetes_pods_run_as_the_image_user_with_their_own_scratch() -> None:
    """No ReadWriteMany volume (issue #30): a pod's data directory is its own scratch
    (staging), and what every pod reads is in the object store the secret names."""
    user = next(args for word, args in _dockerfile() if word == "USER")
    for name in ("api.yaml", "worker.yaml"):
        docs = list(yaml.safe_load_all((DEPLOY / "k8s" / name).read_text()))
        pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
        assert pod["securityContext"] == {"runAsNonRoot": True, "fsGroup": int(user)}
        assert pod["volumes"] == [{"name": "scratch", "emptyDir": {}}]
        env = {e["name"]: e for e in pod["containers"][0]["env"]}
        assert env["PRIVRELEASE_STORAGE_URL"]["valueFrom"]["secretKeyRef"]["key"] == \
            "storage-url"
    secret = yaml.safe_load((DEPLOY / "k8s" / "secret.example.yaml").read_text())
    assert secret["stringData"]["storage-url"].startswith("s3://")


def test_sentinel_compose_has_a_replicated_broker_behind_three_sentinels() -> None:
    doc = yaml.safe_load((DEPLOY / "compose.sentinel.yaml").read_text())
    services = doc["services"]
    nodes, sentinels = ["valkey-0", "valkey-1"], [f"sentinel-{i}" for i in range(3)]
    assert set(services) == {*nodes, *sentinels, "api", "worker"}
    for name, svc in services.items():
        assert svc["restart"] == "unless-stopped", name
        assert svc["healthcheck"]["test"], name
    for name in nodes:
        svc = services[name]
        assert svc["environment"]["SELF"] == name == svc["hostname"]
        assert "./sentinel/users.acl:/etc/valkey/users.acl:ro" in svc["volumes"]
        assert svc["command"] == ["sh", "/etc/valkey/valkey-node.sh"]
    for name in sentinels:
        assert services[name]["environment"]["SELF"] == name
        assert services[name]["environment"]["INITIAL_PRIMARY"] == "valkey-0"
    env = services["api"]["environment"]
    assert env == services["worker"]["environment"]
    url = env["PRIVRELEASE_REDIS_URL"]
    parsed = rkeys.parse_sentinel(url.replace("${VALKEY_PASSWORD:?set VALKEY_PASSWORD}", "pw"))
    assert parsed is not None and parsed.master == "privrelease"
    assert [h for h, _ in parsed.sentinels] == sentinels
    # the record is PostgreSQL's: no step waits for a Valkey replica (WAIT)
    assert not any(name.startswith("PRIVRELEASE_LEDGER_") for name in env)
    assert "PRIVRELEASE_DATABASE_URL" in env
    for name in ("api", "worker"):
        needs = services[name]["depends_on"]
        assert all(needs[s]["condition"] == "service_healthy" for s in ["valkey-1", *sentinels])
    assert "deploy/sentinel/users.acl" in (ROOT / ".gitignore").read_text().splitlines()


def test_sentinel_data_nodes_replicate_under_the_acl() -> None:
    """The replication and sentinel users exist, the service's user can WAIT (not in
    -@dangerous), and the config has no inline comments (Valkey would not start)."""
    acl = (DEPLOY / "sentinel" / "users.acl.example").read_text().splitlines()
    assert acl[0] == "user default off"
    users = {line.split()[1]: line for line in acl}
    assert set(users) == {"default", "privrelease", "replica", "sentinel"}
    assert "+psync" in users["replica"] and "+replconf" in users["replica"]
    assert "+slaveof" in users["sentinel"] and "+config|rewrite" in users["sentinel"]
    conf = (DEPLOY / "sentinel" / "valkey.conf").read_text().splitlines()
    for line in conf:
        assert line.startswith("#") or "#" not in line, line
    assert "appendfsync always" in conf and "aclfile /etc/valkey/users.acl" in conf
    assert "repl-diskless-sync-delay 0" in conf
    node = (DEPLOY / "sentinel" / "valkey-node.sh").read_text()
    assert "--masteruser replica" in node and "get-master-addr-by-name" in node


def test_kubernetes_sentinel_manifests_validate() -> None:
    """deploy/k8s/sentinel/ against the Kubernetes schemas; its ConfigMap carries the very
    scripts and config of deploy/sentinel/, and every secret key it reads is in the
    example secret."""
    import kubernetes_validate

    k8s = DEPLOY / "k8s" / "sentinel"
    listed = yaml.safe_load((k8s / "kustomization.yaml").read_text())["resources"]
    assert sorted([*listed, "secret.example.yaml"]) == sorted(
        p.name for p in k8s.glob("*.yaml") if p.name != "kustomization.yaml")
    docs = [d for name in [*sorted(listed), "secret.example.yaml"]
            for d in yaml.safe_load_all((k8s / name).read_text())]
    for doc in docs:
        kubernetes_validate.validate(doc, "1.30", strict=True)
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    config = by[("ConfigMap", "valkey-sentinel")]["data"]
    for name in ("valkey.conf", "valkey-node.sh", "sentinel.sh"):
        assert config[name] == (DEPLOY / "sentinel" / name).read_text(), name
    assert by[("StatefulSet", "valkey")]["spec"]["replicas"] == 2
    assert by[("StatefulSet", "sentinel")]["spec"]["replicas"] == 3
    assert by[("PodDisruptionBudget", "sentinel")]["spec"]["minAvailable"] == 2
    secret = by[("Secret", "privrelease")]["stringData"]
    assert rkeys.parse_sentinel(secret["redis-url"]) is not None
    text = "\n".join((k8s / name).read_text() for name in listed)
    for key in re.findall(r"key: ([\w.-]+)", text):
        assert key in secret, key
    # the base api and worker wait for no Valkey replica (the record is PostgreSQL's)
    assert "ledger-replicas" not in secret
    for name in ("api.yaml", "worker.yaml"):
        base = (DEPLOY / "k8s" / name).read_text()
        assert "LEDGER_REPLICAS" not in base and "key: database-url" in base, name
