"""The documentation's shape: the README stays a front door, the pages it sends readers to exist,
every relative link (and #anchor) of README.md, docs/*.md and deploy/kserve/README.md resolves,
and every flag they write after `hfserve COMMAND` is one that command takes.

The examples inside those files are run by tests/integration/test_readme_examples.py.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[ \t]*$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def documents() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "deploy" / "kserve" / "README.md"]


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code, where links are links."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text, lower-cased, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors by its text
    text = re.sub(r"[^\w\- ]", "", text.replace("`", "").strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a markdown file; a repeated heading gets -1, -2, ... as on GitHub."""
    found: dict[str, int] = {}
    names = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        heading = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            base = slug(heading.group(1))
            names.add(f"{base}-{found[base]}" if base in found else base)
            found[base] = found.get(base, 0) + 1
    return names


def links() -> list[tuple[str, str]]:
    """(document, target) for every relative link of the documents."""
    found = []
    for document in documents():
        for target in LINK.findall(prose(document.read_text())):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not checked
                found.append((document.relative_to(ROOT).as_posix(), target))
    return found


def test_the_readme_is_a_front_door_of_at_most_300_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move the depth into docs/"


def test_the_readme_shows_the_demo_and_the_test_command_first():
    first_block = re.search(r"^```\w*\n(.*?)^```", README.read_text(), re.MULTILINE | re.DOTALL)
    assert first_block, "README.md has no code block"
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert [command for command in commands if command][:2] == ["bash scripts/demo.sh", "bash scripts/test.sh"]


def headline() -> str:
    """The README's **Headline.** paragraph, its lines joined by single spaces."""
    found = re.search(r"^\*\*Headline\.\*\*(.*?)(?:\n\s*\n|\Z)", README.read_text(), re.MULTILINE | re.DOTALL)
    assert found, "README.md has no **Headline.** paragraph"
    return " ".join(found.group(1).split())


def test_the_readme_headline_command_carries_the_batch_size_the_headline_claims():
    """The headline says the batch size it was measured at, and its command sets that batch size,
    so that the command reproduces the figure whatever the archives' default is at the time."""
    text = headline()
    claimed = re.findall(r"`batchSize` (\d+)|batchSize: (\d+)|batches of (?:up to )?(\d+)", text)
    sizes = {size for groups in claimed for size in groups if size}
    assert len(sizes) == 1, f"the headline should claim one batch size, claims {sorted(sizes) or 'none'}"
    commands = re.findall(r"`(hfserve loadtest [^`]*)`", text)
    assert len(commands) == 1, f"the headline should give one hfserve loadtest command, gives {len(commands)}"
    flag = re.findall(r"--batch-size[ =](\d+)", commands[0])
    assert flag == list(sizes), f"the headline claims batchSize {sizes.pop()}, its command sets --batch-size {flag}"


def test_the_readme_headline_ratio_is_one_that_performance_md_records():
    ratio = re.search(r"\*\*[^*]*?(\d+\.\d+x)\*\*", headline())
    assert ratio, "the headline should give its ratio in bold, as 10.67x"
    performance = (ROOT / "docs" / "performance.md").read_text()
    assert ratio.group(1) in performance, f"the headline's {ratio.group(1)} is not in docs/performance.md"


@pytest.mark.parametrize("page", ["performance.md", "design.md", "operations.md"])
def test_the_pages_the_readme_sends_readers_to_exist(page):
    assert (ROOT / "docs" / page).is_file()
    assert f"(docs/{page}" in README.read_text(), f"README.md does not link docs/{page}"


@pytest.mark.parametrize(
    "page, headings",
    [
        (
            "design.md",
            [
                "Shape strategy",
                "Compile policy",
                "Cold start and AOT packages",
                "Packing",
                "Continuous batching",
                "Scheduling by tokens",
                "Hardware, dtype and threads",
            ],
        ),
        (
            "operations.md",
            [
                "Metrics",
                "Security",
                "Reliability",
                "Managing models",
                "Planning length buckets",
                "Tuning",
                "Troubleshooting",
            ],
        ),
    ],
)
def test_the_pages_keep_the_headings_others_link_to(page, headings):
    text = (ROOT / "docs" / page).read_text()
    for heading in headings:
        assert re.search(rf"^## {re.escape(heading)}$", text, re.MULTILINE), f"docs/{page}: ## {heading}"


def test_the_link_checker_reads_links_and_anchors_as_github_does():
    assert slug("Hardware, dtype and threads") == "hardware-dtype-and-threads"
    assert slug("Shape strategy, and why `dynamic: all`") == "shape-strategy-and-why-dynamic-all"
    assert slug("batchSize and maxBatchDelay with packing") == "batchsize-and-maxbatchdelay-with-packing"
    assert slug("Cold start through TorchServe: the AOT package, the packed cache, neither") == (
        "cold-start-through-torchserve-the-aot-package-the-packed-cache-neither"
    )
    text = "[a](x.md#y) `[b](not-a-link.md)` ![c](img/p.png)\n```\n[d](in-a-block.md)\n```\n"
    assert LINK.findall(prose(text)) == ["x.md#y", "img/p.png"]


@pytest.mark.parametrize("document, target", links(), ids=[f"{document} -> {target}" for document, target in links()])
def test_a_relative_link_resolves(document, target):
    """The file exists and, for an #anchor into a markdown file, so does the heading.

    docs/configuration.md is generated from the code (see docs/contributing.md): links to it fail
    here until it has been generated."""
    path, _, anchor = target.partition("#")
    resolved = (ROOT / document).parent / path if path else ROOT / document
    assert resolved.exists(), f"{document}: {target} -> {resolved.relative_to(ROOT)} does not exist"
    if anchor and resolved.suffix == ".md":
        assert anchor in anchors(resolved), f"{document}: no heading of {path or document} has the anchor #{anchor}"


CODE = re.compile(r"```.*?```|`[^`\n]+`", re.DOTALL)
COMMAND_LINE = re.compile(r"hfserve ([a-z][a-z-]*)([^#|;&`\n]*)")  # up to a comment, a pipe, the next command


def flags_written(text: str) -> list[tuple[str, str]]:
    """(command, flag) for every `--flag` written after `hfserve COMMAND` in the text's code."""
    found = []
    for span in CODE.findall(text):
        for call in COMMAND_LINE.finditer(span):
            found += [(call.group(1), flag) for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", call.group(2))]
    return found


class _Parsed(Exception):
    def __init__(self, parser):
        self.parser = parser


def command_flags(command: str) -> set[str]:
    """The flags `hfserve COMMAND` takes, read from the parser its module builds (stopped before parsing)."""
    import argparse
    import importlib

    from ts_compiled_handlers.scripts.cli import COMMANDS

    module_name, subcommand, _ = COMMANDS[command]

    def stop(parser, *_):
        raise _Parsed(parser)

    main = importlib.import_module(f"ts_compiled_handlers.{module_name}").main
    with pytest.MonkeyPatch.context() as patch, pytest.raises(_Parsed) as parsed:
        patch.setattr(argparse.ArgumentParser, "parse_args", stop)
        main([subcommand] if subcommand else [])
    parser = parsed.value.parser
    if subcommand:
        commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
        parser = commands.choices[subcommand]
    return {flag for action in parser._actions for flag in action.option_strings}


def test_the_flag_reader_takes_each_command_s_own_flags():
    text = "`hfserve build --model X --quantize int8 # --not-this` and\n```\nhfserve start --bind a | grep --x\n```"
    assert flags_written(text) == [("build", "--model"), ("build", "--quantize"), ("start", "--bind")]
    assert {"--quantize", "--calibration"} <= command_flags("build") and "--bind" not in command_flags("build")
    assert "--workers" in command_flags("scale") and "--bind" in command_flags("init")


def test_every_hfserve_flag_the_documents_write_exists():
    from ts_compiled_handlers.scripts.cli import COMMANDS

    written = {(document.name, *pair) for document in documents() for pair in flags_written(document.read_text())}
    commands = {command for _, command, _ in written if command in COMMANDS}
    taken = {command: command_flags(command) for command in commands}
    unknown = sorted(entry for entry in written if entry[1] in taken and entry[2] not in taken[entry[1]])
    assert len(written) > 50 and not unknown, f"flags the commands do not take: {unknown}"
