"""`hfserve`: the one command for what a user does with these handlers.

    hfserve serve ./my-model --port 8080   # all of the below in one command, in the foreground
    hfserve init                       # ./config.properties (secure defaults, to edit) and ./model_store/
    hfserve build --model DIR --model-name minilm   # -> ./model_store/minilm.mar (the task read from DIR)
    hfserve start                      # TorchServe with ./config.properties (or ours: loopback), ./runs/server
    hfserve register minilm.mar        # returns when the worker is warm
    hfserve list | describe NAME | scale NAME --workers N | set-default NAME VERSION | unregister NAME
    hfserve health [--live]            # a probe: exit 0 when ready (or, --live, when TorchServe answers)
    hfserve stop
    hfserve plan --log runs/server/logs/model_log.log --model-name minilm   # length buckets for your traffic
    hfserve benchmark | loadtest       # compiled vs eager per bucket; ours vs stock TorchServe handlers
    hfserve embed-corpus corpus.jsonl vectors.parquet --archive model_store/minilm.mar   # Ray Data

Every path is relative to the folder it runs in, which may be any folder: nothing is written
into the installed package. `hfserve COMMAND --help` shows each command's flags with their
defaults. Bad input (an unknown command, a missing archive, a busy port, a config file that does
not parse, no server) gets one line on stderr and exit status 1 or 2, never a traceback; so does
any other failure, whose traceback `HFSERVE_TRACEBACK=1` shows.
"""

import argparse
import importlib
import importlib.metadata
import os
import sys

import requests
import yaml

from ts_compiled_handlers.runtime import package_files

# command: (module of this package, its own subcommand or None, what it does)
COMMANDS = {
    "serve": ("scripts.serve_model", None, "one command: build MODEL's archive if needed, start, register, serve"),
    "init": ("scripts.serve", "init", "write the secure config.properties and a model_store/ here, to edit"),
    "build": ("scripts.build_mar", None, "build a .mar archive from a model folder (into ./model_store)"),
    "start": ("scripts.serve", "start", "start TorchServe with ./config.properties (or ours: loopback)"),
    "stop": ("scripts.serve", "stop", "stop the server that start launched"),
    "register": ("scripts.serve", "register", "register an archive of the model store; returns when warm"),
    "list": ("scripts.serve", "list", "the registered models"),
    "describe": ("scripts.serve", "describe", "a model's versions, workers, batch settings and queue"),
    "scale": ("scripts.serve", "scale", "set a model's number of workers; returns when new ones are warm"),
    "set-default": ("scripts.serve", "set-default", "the version that /predictions/NAME answers"),
    "unregister": ("scripts.serve", "unregister", "remove a model or one of its versions"),
    "health": ("scripts.serve", "health", "exit 0 if the server is ready (every model warm), else 1: a probe"),
    "plan": ("scripts.plan_buckets", None, "choose length buckets from your traffic's lengths"),
    "benchmark": ("benchmarks.benchmark", None, "compiled vs eager per bucket, in process"),
    "loadtest": ("benchmarks.loadtest", None, "ours vs stock TorchServe handlers on the same traffic"),
    "embed-corpus": ("scripts.embed_corpus", None, "embed a Parquet or JSONL corpus with Ray Data (the ray extra)"),
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Module docstrings as written, and every flag's default in --help (those that have one)."""

    def _get_help_string(self, action):
        text = action.help or ""
        no_default = action.default in (None, False, argparse.SUPPRESS) or action.option_strings == []
        return text if no_default or "(default" in text else f"{text} (default: {action.default})"


class UserError(Exception):
    """Bad input from the user: reported in one line, without a traceback."""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parser() -> argparse.ArgumentParser:
    commands = "\n".join(f"  {name:<12} {what}" for name, (_, _, what) in COMMANDS.items())
    top = OneLineParser(
        prog="hfserve",
        description=__doc__,
        epilog=f"commands:\n{commands}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("--version", action="version", version=f"hfserve (ts-compiled-handlers) {version()}")
    top.add_argument("command", metavar="COMMAND", help="one of the commands below")
    top.add_argument("args", nargs=argparse.REMAINDER, help="the command's own flags (hfserve COMMAND --help)")
    return top


def version() -> str:
    try:
        return importlib.metadata.version("ts-compiled-handlers")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def main(argv=None) -> None:
    top = parser()
    if not (sys.argv[1:] if argv is None else argv):  # a bare `hfserve`: what it can do
        top.print_help()
        return
    args = top.parse_args(argv)
    if args.command not in COMMANDS:
        top.error(f"unknown command {args.command!r}; commands: {', '.join(COMMANDS)}")
    module_name, subcommand, _ = COMMANDS[args.command]
    sys.argv[0] = f"hfserve {args.command}" if subcommand is None else "hfserve"  # argparse's usage line
    forwarded = ([subcommand] if subcommand else []) + args.args
    try:
        importlib.import_module(f"{package_files.NAME}.{module_name}").main(forwarded)
    except Exception as error:
        if os.environ.get("HFSERVE_TRACEBACK"):  # the whole chain, user errors included
            raise
        if isinstance(error, (UserError, FileNotFoundError, yaml.YAMLError, requests.ConnectionError)):
            sys.exit(f"hfserve {args.command}: error: {one_line(error)}")
        where = "HFSERVE_TRACEBACK=1 shows where"
        sys.exit(f"hfserve {args.command}: error: {type(error).__name__}: {one_line(error)} ({where})")


def one_line(error: BaseException) -> str:
    if isinstance(error, requests.ConnectionError):
        return "no TorchServe answers at that address; start one with `hfserve start`"
    if isinstance(error, yaml.YAMLError):
        return f"the config file is not valid YAML: {' '.join(str(error).split())}"
    if isinstance(error, FileNotFoundError):
        return f"no such file: {error.filename}"
    return str(error).splitlines()[0] if str(error) else type(error).__name__


if __name__ == "__main__":
    main()
