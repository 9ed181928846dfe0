"""The documentation's curl and Python examples, run against a real TorchServe, their outputs checked.

The examples are those of README.md, every docs/*.md and deploy/kserve/README.md. Every `curl`
command of a ```bash block is run (with the documents' addresses pointed at this server and $KEY
and $MKEY set, as the README sets them), and so is every ```python block. Where a command is
followed by `# {...}` / `# [...]` lines, its output must have that structure: the same keys, the
same strings, numbers where numbers are shown, `...` for anything (at the end of a list: any
number of further items); a line noted `(repeated` stands for one or more answers. The server is
the run's shared one (tests/integration/conftest.py): the tiny archives of every task and of the
models users bring under the documents' names, and MiniLM and the image model of the documents
(tests/archives.py).
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ANYTHING = "..."


def documents() -> list[str]:
    """The files whose examples are run, relative to the repository's root."""
    docs = sorted(path.relative_to(ROOT).as_posix() for path in (ROOT / "docs").glob("*.md"))
    return ["README.md", *docs, "deploy/kserve/README.md"]


def code_blocks(language: str, documents: list[str]) -> list[tuple[str, str]]:
    """(document, block) for every ```language block of the documents."""
    pattern = re.compile(rf"^```{language}\n(.*?)^```", re.MULTILINE | re.DOTALL)
    return [(name, block) for name in documents for block in pattern.findall((ROOT / name).read_text())]


def curl_examples(documents: list[str]) -> list[tuple[str, str, list[str]]]:
    """(document, command, expected JSON lines) for every curl command of the documents' bash blocks."""
    examples = []
    for name, block in code_blocks("bash", documents):
        lines = block.replace("\\\n", " ").splitlines()
        for index, line in enumerate(lines):
            if line.lstrip().startswith("curl "):
                expected = []
                for following in lines[index + 1 :]:
                    if not following.startswith("# {") and not following.startswith("# ["):
                        break
                    expected.append(following[2:])
                examples.append((name, line.split("  #")[0].strip(), expected))
    return examples


def example_id(name: str, text: str) -> str:
    """A readable test id: the document, then a curl's address and body, or a block's first line."""
    if text.startswith("curl "):
        address = re.search(r"http://127\.0\.0\.1:\d+([^\s\"'?]*)", text)
        body = re.search(r"(?:-d|--data-binary) '([^']*)'", text)
        return f"{name}: {address.group(1) if address else ''} {body.group(1)[:50] if body else ''}".strip()
    return f"{name}: {text.strip().splitlines()[0][:60]}"


def expected_json(line: str):
    """A README output line as JSON: bare `...` becomes the wildcard, trailing notes are dropped."""
    text = re.sub(r'(?<!")\.\.\.(?!")', f'"{ANYTHING}"', line)
    return json.JSONDecoder().raw_decode(text)[0]


def matches(expected, actual) -> bool:
    if expected == ANYTHING:
        return True
    if isinstance(expected, dict):
        same_keys = isinstance(actual, dict) and set(expected) == set(actual)
        return same_keys and all(matches(value, actual[key]) for key, value in expected.items())
    if isinstance(expected, list):
        if not isinstance(actual, list):
            return False
        if expected and expected[-1] == ANYTHING:
            head = expected[:-1]
            return len(actual) >= len(head) and all(map(matches, head, actual))
        return len(actual) == len(expected) and all(map(matches, expected, actual))
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        return isinstance(actual, (int, float)) and not isinstance(actual, bool)
    return expected == actual


@pytest.fixture(scope="module")
def server(task_server):
    return task_server


def parsed(output: str) -> list:
    """One pretty-printed JSON answer, or JSON lines (a stream)."""
    try:
        return [json.loads(output)]
    except json.JSONDecodeError:
        return [json.loads(line) for line in output.splitlines() if line.strip()]


def pointed_at(text: str, server) -> str:
    """The README's default addresses replaced by this server's."""
    for port, url in (("8080", server.inference_url), ("8081", server.management_url), ("8082", server.metrics_url)):
        text = text.replace(f"http://127.0.0.1:{port}", url)
    return text


@pytest.fixture(scope="module")
def readme_cwd(server, tmp_path_factory) -> Path:
    """A folder laid out like the README's: runs/server/key_file.json is this server's."""
    cwd = tmp_path_factory.mktemp("readme")
    (cwd / "runs" / "server").mkdir(parents=True)
    (cwd / "runs" / "server" / "key_file.json").symlink_to(server.key_file())
    return cwd


def test_the_readme_has_examples_with_outputs_for_every_task():
    """The README, the front door, shows every task answering (streaming and KServe v2 included);
    the pages under docs/ add examples of their own, which run too."""
    readme = [(command, expected) for _, command, expected in curl_examples(["README.md"]) if expected]
    commands = " ".join(command for command, _ in readme)
    for path in ("/predictions/minilm", "/predictions/classifier", "/predictions/tagger", "/predictions/generator"):
        assert path in commands, path
    assert "/v2/models/" in commands
    assert any('"stream": true' in command and len(expected) > 1 for command, expected in readme)
    everywhere = curl_examples(documents())
    assert {name for name, _, expected in everywhere if expected} - {"README.md"}, "no document under docs/ runs"
    assert code_blocks("python", documents())


@pytest.mark.parametrize(
    "name, command, expected",
    curl_examples(documents()),
    ids=[example_id(name, command) for name, command, _ in curl_examples(documents())],
)
def test_a_documented_curl_example_runs_and_answers_as_shown(server, readme_cwd, name, command, expected):
    keys = {"KEY": server.key("inference"), "MKEY": server.key("management")}
    result = subprocess.run(
        ["bash", "-c", pointed_at(command, server)],
        cwd=readme_cwd,
        env={**keys, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    if not expected:
        return
    answers = parsed(result.stdout)
    for line in expected:
        count = len(answers) - (len(expected) - 1) if "(repeated" in line else 1
        assert count >= 1, result.stdout
        for answer in answers[:count]:
            assert matches(expected_json(line), answer), f"{line}\n!=\n{json.dumps(answer)[:500]}"
        answers = answers[count:]
    assert answers == [], result.stdout


@pytest.mark.parametrize(
    "name, block",
    code_blocks("python", documents()),
    ids=[example_id(name, block) for name, block in code_blocks("python", documents())],
)
def test_a_documented_python_example_runs(server, readme_cwd, name, block):
    result = subprocess.run(
        [sys.executable, "-c", pointed_at(block, server)], cwd=readme_cwd, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
