"""Starts a real `gpuhost serve` with the three speech workers and talks to it over HTTP (stdlib),
for the end-to-end tests and the quality benchmark."""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import make_eval_set  # noqa: E402


def binary():
    path = os.environ.get("GPUHOST_BIN") or str(REPO / "target/release/gpuhost")
    if not Path(path).exists():
        raise SystemExit(f"{path} is missing: cargo build --release (or set GPUHOST_BIN)")
    return path


def eval_set(out=None):
    out = Path(out or REPO / "target/speech-eval")
    names = make_eval_set.names()
    if not all((out / f"{n}.json").exists() for n in names):
        make_eval_set.main(str(out))
    return out, names


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(
        self, mode="resident", token="e2e-token", engines=None, options=None, extra_config=""
    ):
        """`extra_config`: TOML appended to the generated config (e.g. a `[pipeline]` table)."""
        self.port, self.wyoming_port = free_port(), free_port()
        self.url, self.token = f"http://127.0.0.1:{self.port}", token
        self.dir = tempfile.TemporaryDirectory()
        config = Path(self.dir.name) / "gpuhost.toml"
        engines = engines or {}
        workers = "".join(
            f'[workers.{w}]\nmode = "{mode}"\n'
            + (f'engine = "{engines[w]}"\n' if w in engines else "")
            + (f"options = {(options or {})[w]}\n" if w in (options or {}) else "")
            for w in ("diarizer", "asr", "aligner")
        )
        config.write_text(
            f'listen = "127.0.0.1:{self.port}"\ntoken = "{token}"\nworkers_dir = "{REPO / "workers"}"\n'
            f'[setup]\nsdk_dir = "{REPO / "protocol/sdk"}"\n{workers}'
            f'[wyoming]\nlisten = "127.0.0.1:{self.wyoming_port}"\n{extra_config}'
        )
        self.log = open(Path(self.dir.name) / "log", "w+")
        self.proc = subprocess.Popen(
            [binary(), "serve", "--config", str(config)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, GPUHOST_LOG="info"),
        )
        self.wait_ready(mode)

    def wait_ready(self, mode, timeout=300):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"gpuhost exited: {self.log.read()[-3000:]}")
            try:
                health = json.load(urllib.request.urlopen(f"{self.url}/health", timeout=2))
                if mode == "oneshot" or health["workers"]["ready"] == 3:
                    return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError("workers did not become ready")

    def request(self, path, data=None, headers=None):
        req = urllib.request.Request(
            f"{self.url}{path}",
            data=data,
            headers={"Authorization": f"Bearer {self.token}", **(headers or {})},
        )
        return urllib.request.urlopen(req, timeout=600)

    def post_form(self, path, fields, files):
        """POST multipart/form-data (stdlib): `fields` {name: text}, `files` {name: path}."""
        boundary = uuid.uuid4().hex
        body = b""
        for name, value in fields.items():
            body += (
                (f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n').encode()
                + value.encode()
                + b"\r\n"
            )
        for name, path_ in files.items():
            body += (
                (
                    f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; '
                    f'filename="{Path(path_).name}"\r\nContent-Type: application/octet-stream\r\n\r\n'
                ).encode()
                + Path(path_).read_bytes()
                + b"\r\n"
            )
        body += f"--{boundary}--\r\n".encode()
        headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
        return self.request(path, body, headers)

    def delete(self, path):
        req = urllib.request.Request(
            f"{self.url}{path}", method="DELETE", headers={"Authorization": f"Bearer {self.token}"}
        )
        return urllib.request.urlopen(req, timeout=60)

    def transcribe(self, wav, query=""):
        """(events, wall seconds) of POST /transcribe with the file's bytes."""
        started = time.time()
        with self.request(f"/transcribe{query}", Path(wav).read_bytes()) as r:
            events = [json.loads(line) for line in r]
        return events, time.time() - started

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()
        self.dir.cleanup()
