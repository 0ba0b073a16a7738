"""docker-compose.yml cannot run here (no Docker engine); parse it and check it names real commands."""

from __future__ import annotations

import shlex

import yaml
from support.processes import ROOT

from service.cli import build_parser


def test_compose_file_is_valid_and_uses_real_commands():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "migrate", "api", "worker", "rpc-tracker", "rpc-server"} <= set(services)
    for name, service in services.items():
        if "build" in service:
            assert (ROOT / service["build"] / "Dockerfile").is_file(), name
        command = service.get("command", [])
        if command[:1] == ["altune"]:
            build_parser().parse_args(command[1:])  # exits on an unknown subcommand or flag
    url = services["worker"]["environment"]["ALTUNE_DATABASE_URL"]
    assert url.startswith("postgresql+psycopg://") and "@postgres:" in url
    assert services["api"]["environment"] == services["worker"]["environment"], "one database for all"
    assert set(compose["volumes"]) == {"pgdata", "artifacts"}


def test_dockerfile_copies_every_package():
    dockerfile = (ROOT / "Dockerfile").read_text()
    for package in ("compiler", "tuner", "service", "migrations", "bench"):
        assert f"COPY {package} {package}" in dockerfile
    assert shlex.split(dockerfile.splitlines()[-1].removeprefix("CMD "))
