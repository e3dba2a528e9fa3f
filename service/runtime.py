"""``privrelease standalone``: embedded Valkey, one worker and gunicorn, supervised.

The three run as child processes of this one; Ctrl-C (SIGINT) or SIGTERM
stops the API first (no new requests), then the worker (finishing its job),
then Valkey (flushing its AOF). A second start on the same data directory
finds datasets, ledger and releases where they were.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import FrameType

from service import apikeys, rkeys
from service.config import ENV_PREFIX, Config
from service.store import DatasetStore
from service.valkey import EmbeddedValkey


class Standalone:
    """Supervises the service's processes until a signal or a child exits."""

    def __init__(self, config: Config, host: str, port: int, data_dir: str | None) -> None:
        if data_dir:
            config = dataclasses.replace(config, data_dir=Path(data_dir).resolve())
        self.config = config
        self.host, self.port = host, port
        self.children: list[subprocess.Popen[bytes]] = []
        self.valkey: EmbeddedValkey | None = None
        self._stopping = False

    def _start_valkey(self) -> str:
        self.valkey = EmbeddedValkey(self.config.valkey_dir)
        self.valkey.start()
        return self.valkey.url

    def _env(self, url: str) -> dict[str, str]:
        env = dict(os.environ)
        env[ENV_PREFIX + "REDIS_URL"] = url
        env[ENV_PREFIX + "DATA_DIR"] = str(self.config.data_dir)
        return env

    def _spawn(self, args: list[str], env: dict[str, str]) -> None:
        cmd = [sys.executable, "-m", "service.cli", *args]
        # own session: a terminal Ctrl-C reaches only us, and we stop them in order
        self.children.append(subprocess.Popen(cmd, env=env, start_new_session=True))

    def _wait_http(self, timeout: float = 60.0) -> bool:
        url = f"http://{self.host}:{self.port}/healthz"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(c.poll() is not None for c in self.children):
                return False
            try:
                with urllib.request.urlopen(url, timeout=1) as resp:
                    if resp.status == 200:
                        return True
            except OSError:
                time.sleep(0.2)
        return False

    def _signal(self, signum: int, frame: FrameType | None) -> None:
        self._stopping = True

    def run(self) -> int:
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        DatasetStore(self.config.datasets_dir).sweep_tmp()
        url = self.config.redis_url or self._start_valkey()
        client = rkeys.connect(url)
        _, token = apikeys.create(client, "operator", label="bootstrap",
                                  token=self.config.bootstrap_key)
        env = self._env(url)
        signal.signal(signal.SIGINT, self._signal)
        signal.signal(signal.SIGTERM, self._signal)
        try:
            self._spawn(["worker"], env)
            self._spawn(["api", "--host", self.host, "--port", str(self.port)], env)
            if not self._wait_http():
                print("privrelease: a process failed to start", file=sys.stderr)
                return 1
            print(f"privrelease API on http://{self.host}:{self.port}", flush=True)
            print(f"data directory: {self.config.data_dir}", flush=True)
            if self.config.bootstrap_key:
                print("operator key: registered from PRIVRELEASE_BOOTSTRAP_KEY", flush=True)
            else:
                print(f"operator key (shown once): {token}", flush=True)
            while not self._stopping:
                if any(c.poll() is not None for c in self.children):
                    print("privrelease: a process exited; stopping", file=sys.stderr)
                    return 1
                time.sleep(0.2)
            return 0
        finally:
            self.stop()

    def stop(self) -> None:
        """API first, then worker, then Valkey; each gets time to finish."""
        for child in reversed(self.children):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        self.children.clear()
        if self.valkey is not None:
            self.valkey.stop()
            self.valkey = None
        print("privrelease stopped", flush=True)
