"""Start and stop TorchServe with our config.properties, and talk to its APIs with its tokens.

    python scripts/serve.py start                    # loopback ports 8080-8082, model_store/
    python scripts/serve.py register minilm.mar --batch-size 8 --max-batch-delay 5 --workers 1
    python scripts/serve.py stop

Each server gets its own working directory (key_file.json, logs, TMPDIR with TorchServe's pid
file), so tests can run several side by side and stop exactly the one they started.
"""

import argparse
import json
import os
import re
import socket
import string
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PORTS = {
    "INFERENCE_PORT": 8080,
    "MANAGEMENT_PORT": 8081,
    "METRICS_PORT": 8082,
    "GRPC_INFERENCE_PORT": 7070,
    "GRPC_MANAGEMENT_PORT": 7071,
}


def free_ports(count: int) -> list[int]:
    """Loopback ports that are free right now."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def render_config(model_store: Path, ports: dict[str, int]) -> str:
    """config.properties with the model store's absolute path and the ports filled in."""
    template = string.Template((ROOT / "config.properties").read_text())
    metrics_config = ROOT / "handlers" / "metrics.yaml"
    return template.substitute(ports, MODEL_STORE=model_store.resolve(), METRICS_CONFIG=metrics_config)


# A worker's log lines that say why its initialize failed: our handler's policy line, exceptions.
FAILURE_LINE = re.compile(r"MODEL_LOG - (.*(?:failed|Error: |Exception: ).*)$")


class RegistrationError(RuntimeError):
    """TorchServe refused a model; the message carries the cause from the worker's log."""


class TorchServe:
    """One TorchServe process tree, its working directory and its API tokens."""

    def __init__(self, workdir: Path, model_store: Path, ports: dict[str, int] | None = None, env=None):
        self.workdir = Path(workdir).resolve()
        self.model_store = Path(model_store).resolve()
        self.ports = ports or DEFAULT_PORTS
        self.env = {**os.environ, **(env or {}), "TMPDIR": str(self.workdir / "tmp"), "TEMP": str(self.workdir / "tmp")}
        self.env["LOG_LOCATION"] = self.env["METRICS_LOCATION"] = str(self.workdir / "logs")
        self.inference_url = f"http://127.0.0.1:{self.ports['INFERENCE_PORT']}"
        self.management_url = f"http://127.0.0.1:{self.ports['MANAGEMENT_PORT']}"
        self.metrics_url = f"http://127.0.0.1:{self.ports['METRICS_PORT']}"

    @classmethod
    def on_free_ports(cls, workdir: Path, model_store: Path, env=None) -> "TorchServe":
        return cls(workdir, model_store, dict(zip(DEFAULT_PORTS, free_ports(len(DEFAULT_PORTS)), strict=False)), env)

    def _torchserve(self, *args: str) -> None:
        command = [str(Path(sys.executable).parent / "torchserve"), *args]
        subprocess.run(command, cwd=self.workdir, env=self.env, check=True, stdout=subprocess.DEVNULL)

    def start(self, timeout: float = 120) -> None:
        (self.workdir / "tmp").mkdir(parents=True, exist_ok=True)
        config = self.workdir / "config.properties"
        config.write_text(render_config(self.model_store, self.ports))
        self._torchserve("--start", "--ncs", "--ts-config", str(config), "--model-store", str(self.model_store))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                # /ping needs the inference token too, which exists once the key file is written.
                if self.key_file().is_file() and self.ping().ok:
                    return
            except (requests.ConnectionError, ValueError, KeyError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"TorchServe did not answer /ping within {timeout}s; see {self.workdir / 'logs'}")

    def ping(self) -> requests.Response:
        return requests.get(f"{self.inference_url}/ping", headers=self.headers("inference"), timeout=2)

    def stop(self) -> None:
        self._torchserve("--stop")

    def key_file(self) -> Path:
        return self.workdir / "key_file.json"

    def key(self, api: str) -> str:
        """The current token of `api` ("management" or "inference"); re-read, since keys expire."""
        return json.loads(self.key_file().read_text())[api]["key"]

    def headers(self, api: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key(api)}"}

    def register(self, url: str, batch_size: int = 8, max_batch_delay: int = 5, workers: int = 1, timeout=600):
        """Register an archive of the model store and wait until its workers are warm."""
        params = {
            "url": url,
            "batch_size": batch_size,
            "max_batch_delay": max_batch_delay,
            "initial_workers": workers,
            "synchronous": "true",
        }
        response = requests.post(
            f"{self.management_url}/models", params=params, headers=self.headers("management"), timeout=timeout
        )
        if not response.ok:
            cause = self.failure_cause(Path(url).stem)
            raise RegistrationError(f"{url}: HTTP {response.status_code} {response.text.strip()}\n{cause}")
        return response.json()

    def failure_cause(self, name: str, lines: int = 5) -> str:
        """Why the last worker of `name` failed to start, from the model log (TorchServe's answer has no cause)."""
        log = self.workdir / "logs" / "model_log.log"
        worker_lines = [line for line in log.read_text(errors="replace").splitlines() if f"-{name}_" in line]
        starts = [index for index, line in enumerate(worker_lines) if "Torch worker started" in line]
        found = (FAILURE_LINE.search(line) for line in worker_lines[starts[-1] if starts else 0 :])
        causes = list(dict.fromkeys(match.group(1).strip() for match in found if match))
        return "\n".join(causes[:lines]) or f"no cause found in {log}"

    def describe(self, name: str) -> dict:
        """The management API's description of a model's default version (workers, batch settings, queue)."""
        response = requests.get(f"{self.management_url}/models/{name}", headers=self.headers("management"), timeout=30)
        response.raise_for_status()
        return response.json()[0]

    def worker_pids(self, name: str) -> list[int]:
        return [worker["pid"] for worker in self.describe(name)["workers"] if worker["status"] == "READY"]

    def unregister(self, name: str) -> None:
        requests.delete(f"{self.management_url}/models/{name}", headers=self.headers("management"), timeout=60)

    def predict(self, name: str, body, content_type: str = "application/json", timeout=120) -> requests.Response:
        data = json.dumps(body) if content_type == "application/json" and not isinstance(body, (str, bytes)) else body
        headers = {**self.headers("inference"), "Content-Type": content_type}
        return requests.post(f"{self.inference_url}/predictions/{name}", data=data, headers=headers, timeout=timeout)

    def metrics(self) -> str:
        return requests.get(f"{self.metrics_url}/metrics", timeout=10).text


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["start", "stop", "register", "unregister"], help="what to do")
    parser.add_argument("target", nargs="?", help="register: archive file in the model store; unregister: model name")
    parser.add_argument("--workdir", type=Path, default=ROOT / "runs" / "server", help="server working directory")
    parser.add_argument("--model-store", type=Path, default=ROOT / "model_store", help="folder of .mar archives")
    parser.add_argument("--batch-size", type=int, default=8, help="TorchServe batch size (register)")
    parser.add_argument("--max-batch-delay", type=int, default=5, help="ms to wait to fill a batch (register)")
    parser.add_argument("--workers", type=int, default=1, help="initial workers (register)")
    args = parser.parse_args(argv)
    server = TorchServe(args.workdir, args.model_store)
    if args.command == "start":
        server.start()
        print(f"TorchServe on {server.inference_url}; tokens in {server.key_file()}")
    elif args.command == "stop":
        server.stop()
    elif args.command == "register":
        print(json.dumps(server.register(args.target, args.batch_size, args.max_batch_delay, args.workers)))
    else:
        server.unregister(args.target)


if __name__ == "__main__":
    main()
