"""Start and stop TorchServe with our config.properties, and manage its models with its tokens.

    hfserve init                       # ./config.properties, ./metrics.yaml, ./log4j2.xml, ./model_store/: ours
    hfserve start                      # ports 8080-8082 (or --inference-port ...) at the config's hosts, ./model_store
    hfserve register minilm.mar --workers 1
    hfserve list                       # registered models
    hfserve describe minilm            # versions, workers (pid, status), batch settings, queue
    hfserve scale minilm --workers 2   # up or down; returns when the new workers are warm
    hfserve set-default minilm 2.0     # which version /predictions/minilm answers
    hfserve unregister minilm [1.0]
    hfserve health [--live]            # exit 0 once every registered model has a READY worker: a probe
    hfserve stop

(`python scripts/serve.py COMMAND ...` is the same.)

Each server gets its own working directory (key_file.json, ports.json, logs, TMPDIR with
TorchServe's pid file), made 0700: TorchServe writes key_file.json before it makes the file 0600,
and a command warns when the key file it reads is open to other users. Tests can run several
servers side by side and stop exactly the one they started. Every command but `start` finds the
server by `--workdir` (default $HFSERVE_WORKDIR, else runs/server under the current folder): its
ports.json, or the config.properties of a server started there by hand (`torchserve --start
--ts-config config.properties`, as the image does). `start` takes `--ts-config`, else
./config.properties where there is one, else the package's own secure config; the copy it runs is
in the working directory. TorchServe starts with tcmalloc where libtcmalloc-minimal4 is installed
(handlers/runtime/allocator.py; `HFSERVE_ALLOCATOR=system` keeps glibc's).
"""

import argparse
import json
import os
import re
import socket
import stat
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import requests

from ts_compiled_handlers.runtime import allocator, package_files
from ts_compiled_handlers.scripts.cli import HelpFormatter, UserError

TEMPLATE = package_files.TORCHSERVE_FILES / "config.properties"  # the secure defaults `hfserve init` writes
METRICS = package_files.TORCHSERVE_FILES / "metrics.yaml"  # our metrics, declared for TorchServe
LOG_CONFIG = package_files.TORCHSERVE_FILES / "log4j2.xml"  # the frontend's logging without lines per request
LOG_OPTION = "-Dlog4j.configurationFile="

DEFAULT_PORTS = {  # the repository's config.properties: TorchServe's usual ports
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


APIS = ("inference", "management", "metrics")


def port_settings(ports: dict[str, int], hosts: dict[str, str] | None = None) -> dict[str, str]:
    """config.properties keys for `ports`, each API on its host in `hosts` ("scheme://host"),
    loopback where none is given."""
    hosts = hosts or {}
    return {
        **{f"{api}_address": f"{hosts.get(api, 'http://127.0.0.1')}:{ports[f'{api.upper()}_PORT']}" for api in APIS},
        "grpc_inference_port": str(ports["GRPC_INFERENCE_PORT"]),
        "grpc_management_port": str(ports["GRPC_MANAGEMENT_PORT"]),
    }


def configured_ports(text: str) -> dict[str, int]:
    """The ports a config.properties text sets (TorchServe's defaults where it sets none)."""
    ports = dict(DEFAULT_PORTS)
    for api in APIS:
        port = urllib.parse.urlsplit(read_setting(text, f"{api}_address") or "").port
        ports[f"{api.upper()}_PORT"] = port or ports[f"{api.upper()}_PORT"]
    for key in ("GRPC_INFERENCE_PORT", "GRPC_MANAGEMENT_PORT"):
        ports[key] = int(read_setting(text, key.lower()) or ports[key])
    return ports


def configured_hosts(text: str, bind: str | None = None, metrics_bind: str | None = None) -> dict[str, str]:
    """Each API's "scheme://host" as a config.properties text sets it; `bind` moves the inference
    API, `metrics_bind` the metrics API (it asks no key, so `bind` alone never moves it), the
    management API stays where it is."""
    hosts = {}
    for api in APIS:
        address = urllib.parse.urlsplit(read_setting(text, f"{api}_address") or "")
        if address.hostname:
            hosts[api] = f"{address.scheme or 'http'}://{address.hostname}"
    for api, host in (("inference", bind), ("metrics", metrics_bind)):
        if host:
            scheme = hosts.get(api, "http://").split("://")[0]
            hosts[api] = f"{scheme}://{host}"
    return hosts


def with_settings(text: str, settings: dict[str, str]) -> str:
    """A config.properties text with the values of `settings` replaced; comments and other keys kept."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        key = line.split("=", 1)[0].strip()
        if "=" in line and not line.lstrip().startswith("#") and key in settings:
            lines[index] = f"{key}={settings[key]}"
    missing = set(settings) - {line.split("=", 1)[0].strip() for line in lines}
    return "\n".join(lines + [f"{key}={settings[key]}" for key in sorted(missing)]) + "\n"


def render_config(
    model_store: Path, ports: dict[str, int], base: Path | None = None, bind: str | None = None, metrics_bind=None
) -> str:
    """`base` (default: the package's secure config) for a server run from another folder: absolute
    paths, `ports` on the hosts it names (`bind` moves inference, `metrics_bind` metrics); its metrics_config
    where that file exists beside it, else ours; every other setting kept."""
    base = base or TEMPLATE
    store = model_store.resolve()
    declared = base.parent / (read_setting(base.read_text(), "metrics_config") or "metrics.yaml")
    settings = {
        **port_settings(ports, configured_hosts(base.read_text(), bind, metrics_bind)),
        "model_store": str(store),
        "allowed_urls": f"file://{store}/.*",
        "metrics_config": str((declared if declared.is_file() else METRICS).resolve()),
    }
    vmargs = read_setting(base.read_text(), "vmargs")
    if vmargs:
        settings["vmargs"] = " ".join(absolute_log_config(word, base.parent) for word in vmargs.split())
    return with_settings(base.read_text(), settings)


def absolute_log_config(word: str, folder: Path) -> str:
    """A JVM option as a server run from another folder needs it: a log configuration named
    relative to the config's folder made absolute (the package's where that file is missing)."""
    if not word.startswith(LOG_OPTION) or word[len(LOG_OPTION) :].startswith(("/", "file:")):
        return word
    named = folder / word[len(LOG_OPTION) :]
    return LOG_OPTION + str((named if named.is_file() else LOG_CONFIG).resolve())


def read_setting(text: str, key: str) -> str | None:
    """The value of `key` in a config.properties text (None where it is not set)."""
    values = [line.split("=", 1)[1].strip() for line in text.splitlines() if line.split("=", 1)[0].strip() == key]
    return values[-1] if values else None


def init(
    folder: Path,
    force: bool = False,
    bind: str = "127.0.0.1",
    store: str = "model_store",
    metrics_bind: str = "127.0.0.1",
) -> list[Path]:
    """Our secure config.properties, metrics.yaml and log4j2.xml in `folder`, and an empty model store there:
    what a plain `torchserve --start --ts-config config.properties` run there reads. `bind` moves
    the inference API (a container's published ports), `metrics_bind` the metrics API, which asks
    no key and so stays on loopback unless asked; management stays on loopback."""
    written = [folder / "config.properties", folder / "metrics.yaml", folder / "log4j2.xml"]
    existing = [str(path) for path in written if path.exists()]
    if existing and not force:
        raise UserError(f"{', '.join(existing)} exists; pass --force to overwrite")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", store):
        raise UserError(f"--model-store {store!r}: a folder name in {folder}, letters, digits, _ . - only")
    text = TEMPLATE.read_text()
    settings = {"model_store": store, "allowed_urls": f"{store}/[A-Za-z0-9_.-]+[.]mar"}
    hosts = {"inference": bind, "metrics": metrics_bind}
    for api, host in hosts.items():
        settings[f"{api}_address"] = read_setting(text, f"{api}_address").replace("127.0.0.1", host)
    # the comments say what this file sets: its model store, and where it listens
    text = text.replace("--model-store model_store", f"--model-store {store}")
    text = text.replace("# Every listener on loopback only, gRPC too;", listeners_comment(hosts))
    (folder / store).mkdir(parents=True, exist_ok=True)
    written[0].write_text(with_settings(text, settings))
    written[1].write_text(METRICS.read_text())
    written[2].write_text(LOG_CONFIG.read_text())
    return [*written, folder / store]


def listeners_comment(hosts: dict[str, str]) -> str:
    """The config's comment line on where it listens, for the inference and metrics hosts of `init`."""
    if set(hosts.values()) == {"127.0.0.1"}:
        return "# Every listener on loopback only, gRPC too;"
    if hosts["inference"] == hosts["metrics"]:
        return f"# Inference and metrics on {hosts['inference']}; management and gRPC on loopback only;"
    return f"# Inference on {hosts['inference']}, metrics on {hosts['metrics']}; management and gRPC on loopback only;"


def private_workdir(folder: Path) -> None:
    """`folder` made (or narrowed to) 0700 where it is this user's: TorchServe writes key_file.json
    there, readable by all until it makes the file 0600, and its logs and pid file."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = folder.stat()
    if info.st_uid == os.getuid() and info.st_mode & 0o077:
        folder.chmod(0o700)


def warn_if_open(key_file: Path) -> None:
    """Say so on stderr where a key file can be read or changed by group or others (TorchServe
    makes its own 0600; a copy, or one made by hand, may not be)."""
    try:
        mode = stat.S_IMODE(key_file.stat().st_mode)
    except FileNotFoundError:
        return
    if mode & 0o077:
        print(
            f"hfserve: WARNING: {key_file} (mode {mode:04o}) is open to other users, who may read the "
            f"server's tokens or change them: chmod 600 {key_file}",
            file=sys.stderr,
        )


# A worker's log lines that say why its initialize failed: our handler's policy line, exceptions.
FAILURE_LINE = re.compile(r"MODEL_LOG - (.*(?:failed|Error: |Exception: ).*)$")


class ManagementError(RuntimeError):
    """The management API refused a call; the message carries its answer."""


class RegistrationError(ManagementError):
    """TorchServe refused a model; the message carries the cause from the worker's log."""


REGISTERED = re.compile(r'Model "(?P<name>[^"]+)" Version: (?P<version>\S+) registered with (?P<workers>\d+)')


class TorchServe:
    """One TorchServe process tree, its working directory and its API tokens."""

    bin_dir = Path(sys.executable).parent  # the environment whose torchserve runs (its Python runs the workers)

    def __init__(self, workdir: Path, model_store: Path, ports: dict[str, int] | None = None, env=None):
        self.workdir = Path(workdir).resolve()
        self.model_store = Path(model_store).resolve()
        self.ports = ports or DEFAULT_PORTS
        self.env = {**os.environ, **(env or {}), "TMPDIR": str(self.workdir / "tmp"), "TEMP": str(self.workdir / "tmp")}
        self.env.update(allocator.preload(self.env))  # the frontend's, which its workers inherit
        self.env["LOG_LOCATION"] = self.env["METRICS_LOCATION"] = str(self.workdir / "logs")
        self.inference_url = f"http://127.0.0.1:{self.ports['INFERENCE_PORT']}"
        self.management_url = f"http://127.0.0.1:{self.ports['MANAGEMENT_PORT']}"
        self.metrics_url = f"http://127.0.0.1:{self.ports['METRICS_PORT']}"

    @classmethod
    def on_free_ports(cls, workdir: Path, model_store: Path, env=None) -> "TorchServe":
        return cls(workdir, model_store, dict(zip(DEFAULT_PORTS, free_ports(len(DEFAULT_PORTS)), strict=False)), env)

    @classmethod
    def attach(cls, workdir: Path) -> "TorchServe":
        """The server started from `workdir`: by `start` (its ports and model store are recorded in
        ports.json), or by `torchserve --start` run there with its config.properties (the image's
        entry point does so), read from that config."""
        workdir = Path(workdir)
        if (workdir / "ports.json").is_file():
            recorded = json.loads((workdir / "ports.json").read_text())
            server = cls(workdir, Path(recorded["model_store"]), recorded["ports"])
        else:
            text = (workdir / "config.properties").read_text()
            store = workdir / (read_setting(text, "model_store") or "model_store")
            server = cls(workdir, store, configured_ports(text))
        warn_if_open(server.key_file())
        return server

    def run(self, *args: str) -> None:
        """`torchserve ARGS` in the working directory, as a user would type it there."""
        private_workdir(self.workdir)
        (self.workdir / "tmp").mkdir(parents=True, exist_ok=True)
        command = [str(self.bin_dir / "torchserve"), *args]
        subprocess.run(command, cwd=self.workdir, env=self.env, check=True, stdout=subprocess.DEVNULL)

    def wait_until_ready(self, names: list[str], timeout: float = 600) -> None:
        """Until every model of `names` has a READY worker (TorchServe's /ping says 200 before that)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if all(self.worker_pids(name) for name in names):
                    return
            except (requests.ConnectionError, ValueError, KeyError, ManagementError):
                pass
            time.sleep(1)
        raise TimeoutError(f"models {names} not ready within {timeout}s; see {self.workdir / 'logs'}")

    def start(
        self,
        timeout: float = 120,
        config_text: str | None = None,
        base_config: Path | None = None,
        bind=None,
        metrics_bind=None,
    ) -> None:
        """Start with our config.properties, or with `config_text` (another profile: then return once
        TorchServe answers /ping at all, since its models may still be warming up)."""
        private_workdir(self.workdir)
        (self.workdir / "tmp").mkdir(parents=True, exist_ok=True)
        config = self.workdir / "config.properties"
        config.write_text(config_text or render_config(self.model_store, self.ports, base_config, bind, metrics_bind))
        recorded = {"ports": self.ports, "model_store": str(self.model_store)}
        (self.workdir / "ports.json").write_text(json.dumps(recorded))
        self.run("--start", "--ncs", "--ts-config", str(config), "--model-store", str(self.model_store))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if config_text is not None:
                    self.ping()
                    return
                # /ping needs the inference token too, which exists once the key file is written.
                if self.key_file().is_file() and self.ping().ok:
                    warn_if_open(self.key_file())
                    return
            except (requests.ConnectionError, ValueError, KeyError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"TorchServe did not answer /ping within {timeout}s; see {self.workdir / 'logs'}")

    def ping(self) -> requests.Response:
        return requests.get(f"{self.inference_url}/ping", headers=self.headers("inference"), timeout=2)

    def stop(self) -> None:
        self.run("--stop")

    def frontend_pid(self) -> int:
        """The process id of the Java frontend (`torchserve` records it in its temporary folder)."""
        return int((self.workdir / "tmp" / ".model_server.pid").read_text().split()[0])

    def key_file(self) -> Path:
        return self.workdir / "key_file.json"

    def key(self, api: str) -> str:
        """The current token of `api` ("management" or "inference"); re-read, since keys expire."""
        return json.loads(self.key_file().read_text())[api]["key"]

    def headers(self, api: str) -> dict[str, str]:
        """The bearer token of `api`; none where token authorization is off (no key file)."""
        return {"Authorization": f"Bearer {self.key(api)}"} if self.key_file().is_file() else {}

    def register(self, url: str, batch_size=None, max_batch_delay=None, workers: int = 1, timeout=600):
        """Register an archive of the model store and wait until its workers are warm. A batch size
        or delay given here overrides the archive's (its model-config.yaml)."""
        params = {"url": url, "initial_workers": workers, "synchronous": "true"}
        if batch_size is not None:
            params["batch_size"] = batch_size
        if max_batch_delay is not None:
            params["max_batch_delay"] = max_batch_delay
        response = requests.post(
            f"{self.management_url}/models", params=params, headers=self.headers("management"), timeout=timeout
        )
        if not response.ok:
            cause = self.failure_cause(Path(url).stem)
            raise RegistrationError(f"{url}: HTTP {response.status_code} {response.text.strip()}\n{cause}")
        answer = response.json()
        # TorchServe starts the archive's minWorkers, not initial_workers, when model-config.yaml
        # sets them (ours does): scale to what was asked.
        registered = REGISTERED.search(answer.get("status", ""))
        if registered and int(registered["workers"]) != workers:
            return self.scale(registered["name"], workers, registered["version"])
        return answer

    def failure_cause(self, name: str, lines: int = 5) -> str:
        """Why the last worker of `name` failed to start, from the model log (TorchServe's answer has no cause)."""
        log = self.workdir / "logs" / "model_log.log"
        if not log.is_file():
            return f"no worker log at {log}"
        worker_lines = [line for line in log.read_text(errors="replace").splitlines() if f"-{name}_" in line]
        starts = [index for index, line in enumerate(worker_lines) if "Torch worker started" in line]
        found = (FAILURE_LINE.search(line) for line in worker_lines[starts[-1] if starts else 0 :])
        causes = list(dict.fromkeys(match.group(1).strip() for match in found if match))
        return "\n".join(causes[:lines]) or f"no cause found in {log}"

    def _management(self, method: str, path: str, timeout: float = 600, **params) -> dict | list:
        url = f"{self.management_url}/{path}"
        response = requests.request(method, url, params=params, headers=self.headers("management"), timeout=timeout)
        if not response.ok:
            raise ManagementError(f"{method} /{path}: HTTP {response.status_code} {response.text.strip()}")
        return response.json()

    def list_models(self) -> list[dict]:
        return self._management("GET", "models")["models"]

    def describe(self, name: str, version: str | None = None) -> dict:
        """The management API's description of one version (default: the default one) of a model."""
        return self._management("GET", f"models/{name}" + (f"/{version}" if version else ""))[0]

    def worker_pids(self, name: str) -> list[int]:
        return [worker["pid"] for worker in self.describe(name)["workers"] if worker["status"] == "READY"]

    def scale(self, name: str, workers: int, version: str | None = None) -> dict:
        """Run exactly `workers` workers; returns once new ones are warm (TorchServe's synchronous scaling)."""
        path = f"models/{name}" + (f"/{version}" if version else "")
        return self._management("PUT", path, min_worker=workers, max_worker=workers, synchronous="true")

    def set_default(self, name: str, version: str) -> dict:
        return self._management("PUT", f"models/{name}/{version}/set-default")

    def unregister(self, name: str, version: str | None = None) -> dict:
        return self._management("DELETE", f"models/{name}" + (f"/{version}" if version else ""), timeout=120)

    def predict(
        self, name: str, body, content_type: str = "application/json", timeout=120, headers: dict | None = None
    ) -> requests.Response:
        """POST `body` to the model; `headers`: the caller's own besides the key and content type."""
        data = json.dumps(body) if content_type == "application/json" and not isinstance(body, (str, bytes)) else body
        headers = {**(headers or {}), **self.headers("inference"), "Content-Type": content_type}
        return requests.post(f"{self.inference_url}/predictions/{name}", data=data, headers=headers, timeout=timeout)

    def infer_v2(self, name: str, texts: list[str], request_id: str | None = None, **parameters) -> requests.Response:
        """A KServe v2 inference request (`/v2/models/{name}/infer`) with one BYTES input of `texts`."""
        body = {"inputs": [{"name": "text", "shape": [len(texts)], "datatype": "BYTES", "data": texts}]}
        body.update({"id": request_id} if request_id else {}, **({"parameters": parameters} if parameters else {}))
        url = f"{self.inference_url}/v2/models/{name}/infer"
        return requests.post(url, json=body, headers=self.headers("inference"), timeout=120)

    def metrics(self) -> str:
        return requests.get(f"{self.metrics_url}/metrics", timeout=10).text


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    workdir = Path(os.environ.get("HFSERVE_WORKDIR", Path("runs") / "server"))
    parser.add_argument("--workdir", type=Path, default=workdir, help="the server's working directory")
    common = argparse.ArgumentParser(add_help=False)  # --workdir after the command too (the newer spelling)
    text = f"the server's working directory (default: {workdir})"
    common.add_argument("--workdir", type=Path, default=argparse.SUPPRESS, help=text)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=text, description=text, parents=[common], formatter_class=HelpFormatter)

    start = command("start", "start TorchServe with a copy of config.properties (absolute paths, these ports)")
    start.add_argument("--bind", help="the inference API's address (default: the config's; the package's is loopback)")
    start.add_argument(
        "--metrics-bind", help="the metrics API's address (it asks no key; default: the config's, never --bind)"
    )
    start.add_argument(
        "--model-store", type=Path, help="folder of .mar archives (default: the config's model_store, or ./model_store)"
    )
    start.add_argument(
        "--ts-config", type=Path, help="the config to start from (default: ./config.properties, else the package's)"
    )
    for key, port in DEFAULT_PORTS.items():
        start.add_argument(f"--{key.lower().replace('_', '-')}", type=int, default=port, help="loopback port")
    command("stop", "stop the server of --workdir")
    init_command = command(
        "init", "write config.properties, metrics.yaml, log4j2.xml and model_store/ into a folder, to edit"
    )
    init_command.add_argument("folder", nargs="?", type=Path, default=Path("."), help="where they go")
    init_command.add_argument("--force", action="store_true", help="overwrite the files it writes")
    init_command.add_argument("--bind", default="127.0.0.1", help="the inference API's address")
    init_command.add_argument(
        "--metrics-bind", default="127.0.0.1", help="the metrics API's address (it asks no key; never moved by --bind)"
    )
    init_command.add_argument("--model-store", dest="store", default="model_store", help="the model store's folder")
    register = command("register", "register an archive of the model store; returns when its workers are warm")
    register.add_argument("archive", help="a .mar file in the model store")
    register.add_argument(
        "--batch-size",
        type=int,
        help="TorchServe's batch size, over the archive's (an asyncCommunication archive: only 1)",
    )
    register.add_argument("--max-batch-delay", type=int, help="ms to wait to fill a batch, over the archive's")
    register.add_argument(
        "--workers",
        type=int,
        default=1,
        help="workers to start (TorchServe alone would start the archive's minWorkers instead)",
    )
    command("list", "registered models")
    for name, text in (("describe", "versions, workers, batch settings, queue"), ("unregister", "remove")):
        sub = command(name, text)
        model_name_arguments(sub)
        sub.add_argument("version", nargs="?", help="default: the default version")
    scale = command("scale", "set the number of workers; returns when new workers are warm")
    model_name_arguments(scale)
    scale.add_argument("--workers", type=int, required=True, help="workers to run (min = max)")
    scale.add_argument("--version", help="default: the default version")
    health_command = command(
        "health",
        "exit 0 when TorchServe answers /ping (with its key) and every registered model has a READY "
        "worker, else say what is missing and exit 1: a readiness probe",
    )
    health_command.add_argument(
        "--live", action="store_true", help="only whether TorchServe answers /ping: a liveness probe"
    )
    default = command("set-default", "the version that /predictions/NAME answers")
    model_name_arguments(default)
    default.add_argument("version")
    args = parser.parse_args(argv)
    if hasattr(args, "name_option"):
        settle_model_name(parser, args)
    return args


def model_name_arguments(command: argparse.ArgumentParser) -> None:
    """The model's name as the first argument, or as --name / --model-name (the build's flags)."""
    command.add_argument("name", nargs="?", help="the model's name (or --name)")
    command.add_argument("--name", "--model-name", dest="name_option", metavar="NAME", help="the model's name")


def settle_model_name(parser: argparse.ArgumentParser, args) -> None:
    if args.name_option is None:
        if args.name is None:
            parser.error(f"{args.command}: the model's name is missing (NAME or --name NAME)")
        return
    if args.name is not None:  # `describe --name m 2.0`: the one argument given is the version
        if getattr(args, "version", None) is not None:
            parser.error(f"{args.command}: the model's name is given twice (NAME and --name)")
        args.version = args.name
    args.name = args.name_option


def start(args) -> TorchServe:
    ports = {key: getattr(args, key.lower()) for key in DEFAULT_PORTS}
    for key, port in ports.items():
        if busy(port):
            option = "--" + key.lower().replace("_", "-")
            raise UserError(f"port {port} ({option}) is in use: stop what holds it, or pass {option} with a free port")
    config = args.ts_config or (Path("config.properties") if Path("config.properties").is_file() else TEMPLATE)
    if not config.is_file():
        raise UserError(f"no config file {config}")
    server = TorchServe(args.workdir, args.model_store or model_store_of(config), ports)
    server.start(base_config=config, bind=args.bind, metrics_bind=args.metrics_bind)
    print(f"started with a copy of {config} (absolute paths, these ports): {server.workdir / 'config.properties'}")
    print(f"TorchServe on {server.inference_url}; tokens in {server.key_file()}")
    return server


def model_store_of(config: Path) -> Path:
    """The model store a config names, relative to its folder (where `hfserve init` made it);
    ./model_store for the package's own config."""
    named = read_setting(config.read_text(), "model_store") if config != TEMPLATE else None
    return config.parent / named if named else Path("model_store")


def busy(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def register(server: TorchServe, args) -> dict:
    if "://" not in args.archive and not (server.model_store / args.archive).is_file():
        raise UserError(f"{args.archive} is not in the model store {server.model_store}; build it with hfserve build")
    return server.register(args.archive, args.batch_size, args.max_batch_delay, args.workers)


def health(server: TorchServe, live: bool) -> None:
    """Probe the server the way Kubernetes needs it: TorchServe's /ping takes the inference key and
    says 200 before models are warm, so readiness also asks the management API for READY workers."""
    try:
        answer = server.ping()
        if answer.status_code != 200:
            raise UserError(f"TorchServe answers /ping with HTTP {answer.status_code}")
        waiting = [] if live else [model["modelName"] for model in server.list_models()]
        waiting = [name for name in waiting if not server.worker_pids(name)]
    except (requests.RequestException, ValueError, KeyError) as error:  # not up yet, or its key file half-written
        raise UserError(f"no TorchServe answers yet ({type(error).__name__})") from error
    if waiting:
        raise UserError(f"not ready: no READY worker yet for {', '.join(waiting)}")
    print("alive" if live else "ready")


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.command == "start":
        start(args)
        return
    if args.command == "init":
        written = init(args.folder, args.force, args.bind, args.store, args.metrics_bind)
        print("wrote " + ", ".join(str(path) for path in written))
        return
    if not any((args.workdir / name).is_file() for name in ("ports.json", "config.properties")):
        raise UserError(f"no server was started from {args.workdir}; run hfserve start (or pass its --workdir)")
    server = TorchServe.attach(args.workdir)
    calls = {
        "stop": server.stop,
        "register": lambda: register(server, args),
        "list": server.list_models,
        "describe": lambda: server.describe(args.name, args.version),
        "scale": lambda: server.scale(args.name, args.workers, args.version),
        "set-default": lambda: server.set_default(args.name, args.version),
        "unregister": lambda: server.unregister(args.name, args.version),
        "health": lambda: health(server, args.live),
    }
    try:
        result = calls[args.command]()
    except ManagementError as error:
        raise UserError(
            str(error).splitlines()[0] + "".join(f"; {line}" for line in str(error).splitlines()[1:3])
        ) from error
    if result is not None:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    from ts_compiled_handlers.scripts.cli import main as cli_main

    cli_main(sys.argv[1:])
