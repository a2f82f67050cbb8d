"""The demo's outside world on loopback: the fake Lightup, PagerDuty/Opsgenie/Slack and identity provider.

Each runs as its own process (``dw_dagster_dev.fakes.lightup_server``, ``dw_dagster_dev.fakes.paging_server``,
``dw_dagster_dev.fakes.oidc_server``) and exits with the demo. While they run, :class:`FakeServices`
sets the environment a deployment would give the code location for the real services
(``LIGHTUP_CREDENTIAL_FILE``, ``PAGERDUTY_*``, ``SLACK_*``, ``DW_OIDC_ISSUER``: credentials and
URLs, read where a deployment's are read) and puts it back afterwards; nothing in the code
location is wired through them. :class:`OidcProvider` alone is what a demo without Lightup and
paging needs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from dw_dagster_dev.fakes.paging_server import DEFAULT_PAGERDUTY_TOKEN, DEFAULT_PAGERDUTY_USERS, DEFAULT_ROUTING_KEY, DEFAULT_SLACK_TOKEN

APPROVALS_CHANNEL = "C0DWAPPROV"
OIDC_ISSUER_ENV = "DW_OIDC_ISSUER"
OIDC_CLIENT = "dw-dagster"


class ServiceError(RuntimeError):
    """A fake server did not start."""


def _start(args: list[str], log: Path, timeout_s: float = 30.0) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "dw_dagster_dev.fakes.child", str(os.getpid()), *args],
                            stdout=subprocess.PIPE, stderr=open(log, "w"), text=True)
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line or time.monotonic() > deadline:
        proc.kill()
        raise ServiceError(f"{args[0]} did not start; see {log}")
    return proc, line


class OidcProvider:
    """The stand-in identity provider (its people log in without a password) as a child process;
    sets ``$DW_OIDC_ISSUER`` while it runs. Use as a context manager."""

    def __init__(self, folder: Path, users: list[str]) -> None:
        self.folder, self.users = folder, users
        self.url, self.proc, self._saved = "", None, None

    def __enter__(self) -> "OidcProvider":
        self.folder.mkdir(parents=True, exist_ok=True)
        args = ["dw_dagster_dev.fakes.oidc_server", "--port", "0", "--client", OIDC_CLIENT]
        for u in self.users:
            args += ["--user", u]
        self.proc, self.url = _start(args, self.folder / "fake_oidc.log")
        self._saved = os.environ.get(OIDC_ISSUER_ENV)
        os.environ[OIDC_ISSUER_ENV] = self.url
        return self

    def __exit__(self, *exc: object) -> None:
        if self._saved is None:
            os.environ.pop(OIDC_ISSUER_ENV, None)
        else:
            os.environ[OIDC_ISSUER_ENV] = self._saved
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@dataclass
class FakeServices:
    """Start both fakes for one demo home; use as a context manager."""

    folder: Path
    source_url: str
    warehouse_url: str
    lightup_url: str = ""
    paging_url: str = ""
    workspace_uuid: str = ""
    credential_file: Path | None = None
    oidc_users: list[str] = field(default_factory=list)
    oidc_url: str = ""
    procs: list[subprocess.Popen] = field(default_factory=list)
    _saved_env: dict[str, str | None] = field(default_factory=dict)

    def __enter__(self) -> FakeServices:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.credential_file = self.folder / "lightup-api-credential.json"
        try:
            proc, line = _start(["dw_dagster_dev.fakes.lightup_server", "--port", "0", "--credential-file",
                                 str(self.credential_file), "--source-url", self.source_url,
                                 "--warehouse-url", self.warehouse_url], self.folder / "fake_lightup.log")
            self.procs.append(proc)
            info = json.loads(line)
            self.lightup_url, self.workspace_uuid = info["url"], info["workspace_uuid"]
            proc, self.paging_url = _start(["dw_dagster_dev.fakes.paging_server", "--port", "0"], self.folder / "fake_paging.log")
            self.procs.append(proc)
            args = ["dw_dagster_dev.fakes.oidc_server", "--port", "0", "--client", OIDC_CLIENT]
            for u in self.oidc_users:
                args += ["--user", u]
            proc, self.oidc_url = _start(args, self.folder / "fake_oidc.log")
            self.procs.append(proc)
        except Exception:
            self.__exit__()
            raise
        env = {
            "LIGHTUP_CREDENTIAL_FILE": str(self.credential_file),
            "LIGHTUP_WORKSPACE": self.workspace_uuid,
            "PAGERDUTY_ROUTING_KEY": DEFAULT_ROUTING_KEY,
            "PAGERDUTY_API_TOKEN": DEFAULT_PAGERDUTY_TOKEN,
            "PAGERDUTY_FROM": DEFAULT_PAGERDUTY_USERS[0],
            "PAGERDUTY_EVENTS_URL": self.paging_url,
            "PAGERDUTY_API_URL": self.paging_url,
            "SLACK_BOT_TOKEN": DEFAULT_SLACK_TOKEN,
            "SLACK_API_URL": f"{self.paging_url}/api",
            "SLACK_CHANNEL": APPROVALS_CHANNEL,
            OIDC_ISSUER_ENV: self.oidc_url,
        }
        self._saved_env = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        return self

    def __exit__(self, *exc: object) -> None:
        for k, v in self._saved_env.items():  # the environment is put back as it was
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._saved_env = {}
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        self.procs.clear()

    def lightup_collect(self) -> int:
        """Run Lightup's scheduled collection now (the fake's stand-in for its schedule); incidents changed."""
        r = httpx.post(f"{self.lightup_url}/_fake/collect", json={}, timeout=120)
        r.raise_for_status()
        return r.json()["incidents_changed"]

    def lightup_state(self) -> dict:
        return httpx.get(f"{self.lightup_url}/_fake/state", timeout=30).json()

    def paging_state(self) -> dict:
        return httpx.get(f"{self.paging_url}/_fake/state", timeout=30).json()


@dataclass
class PagingFake:
    """The fake PagerDuty and Slack alone (no Lightup) as a child process; sets the environment a
    deployment gives the code location (``PAGERDUTY_*``, ``SLACK_*``) while it runs. Use as a context manager."""

    folder: Path
    url: str = ""
    proc: subprocess.Popen | None = None
    _saved_env: dict[str, str | None] = field(default_factory=dict)

    def __enter__(self) -> "PagingFake":
        self.folder.mkdir(parents=True, exist_ok=True)
        self.proc, self.url = _start(["dw_dagster_dev.fakes.paging_server", "--port", "0"], self.folder / "fake_paging.log")
        env = {"PAGERDUTY_ROUTING_KEY": DEFAULT_ROUTING_KEY, "PAGERDUTY_API_TOKEN": DEFAULT_PAGERDUTY_TOKEN,
               "PAGERDUTY_FROM": DEFAULT_PAGERDUTY_USERS[0], "PAGERDUTY_EVENTS_URL": self.url, "PAGERDUTY_API_URL": self.url,
               "SLACK_BOT_TOKEN": DEFAULT_SLACK_TOKEN, "SLACK_API_URL": f"{self.url}/api", "SLACK_CHANNEL": APPROVALS_CHANNEL}
        self._saved_env = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        return self

    def __exit__(self, *exc: object) -> None:
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._saved_env = {}
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def state(self) -> dict:
        return httpx.get(f"{self.url}/_fake/state", timeout=30).json()
