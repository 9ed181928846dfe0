"""The adapters around the engine: TorchServe's handler steps overridden the TorchServe way, a
protocol added from outside the package, routes, and the size of the served package's code."""

import ast
import json
from pathlib import Path

import pytest
import torch
from fakes import decoded, ready_handler, status
from ts.context import RequestProcessor

from ts_compiled_handlers.loops.request_batches import Batch
from ts_compiled_handlers.protocols import Protocol, Request, RequestSpec, Served
from ts_compiled_handlers.request.payload import RequestError, check_texts
from ts_compiled_handlers.scripts.python_source import parsed
from ts_compiled_handlers.servers.torchserve.handler import Handler
from ts_compiled_handlers.tasks.embedding import EmbeddingTask

EAGER = {"buckets": {"seq_lens": [8, 32], "batch_sizes": [1, 4]}, "compile": {"enable": False}}
PACKAGE = Path(__file__).parents[2] / "handlers"


def ask(handler, bodies: list, routes: list[str] | None = None) -> list:
    """One batch through `handle`, each request with its `url_path` (the route after the version)."""
    routes = routes or [""] * len(bodies)
    headers = [{"body": {"content-type": "application/json"}, **({"url_path": r} if r else {})} for r in routes]
    handler.context.request_processor = [RequestProcessor(header) for header in headers]
    handler.context.request_ids = {index: f"request-{index}" for index in range(len(bodies))}
    return decoded(handler.handle([{"body": body} for body in bodies], handler.context), handler.context)


class Counting(Handler):
    """A user's subclass of every step, written as TorchServe's docs teach: super() called."""

    seen: list[str] = []

    def preprocess(self, data):
        self.seen.append("preprocess")
        return super().preprocess(data)

    def inference(self, data: Batch, *args, **kwargs):
        self.seen.append("inference")
        data = super().inference(data, *args, **kwargs)
        for index, rows in data.outputs.items():  # every embedding doubled before it is answered
            data.outputs[index] = [row * 2 for row in rows]
        return data

    def postprocess(self, data):
        self.seen.append("postprocess")
        return [{**answer, "steps": len(self.seen)} for answer in super().postprocess(data)]


@pytest.fixture(scope="module")
def plain(tiny_models):
    return ready_handler("embedding", tiny_models["embedding"], **EAGER)


def test_preprocess_inference_and_postprocess_are_overridden_the_torchserve_way(tiny_models, plain):
    counting = ready_handler(Counting, tiny_models["embedding"], **EAGER)
    (answer,) = ask(counting, [{"inputs": "hello world", "normalize": False}])
    (expected,) = ask(plain, [{"inputs": "hello world", "normalize": False}])
    assert counting.seen == ["preprocess", "inference", "postprocess"] and answer["steps"] == 3
    torch.testing.assert_close(torch.tensor(answer["embedding"]), 2 * torch.tensor(expected["embedding"]))


class Shouted(Protocol):
    """A toy protocol from outside the package: `{"shout": text}` at /shout, answered with the
    embedding's size and first value, refusals as `{"problem": ...}`."""

    routes = ("shout",)

    def read(self, value, spec: RequestSpec) -> Request:
        if not isinstance(value, dict) or set(value) != {"shout"} or not isinstance(value["shout"], str):
            raise RequestError(400, "send {'shout': text}")
        return Request(check_texts([value["shout"].upper()], spec.max_inputs), {}, self, is_list=False)

    def encode(self, request: Request, answers: list, served: Served, prompt_tokens: int = 0):
        return {"model": served.model_name, "size": len(answers[0].embedding), "first": answers[0].embedding[0]}

    def error(self, error: RequestError):
        return {"problem": error.message}


class ShoutingHandler(Handler):
    class task_class(EmbeddingTask):
        protocols = (Shouted(), *EmbeddingTask.protocols)


def test_a_protocol_is_added_without_touching_the_handler(tiny_models, plain):
    handler = ready_handler(ShoutingHandler, tiny_models["embedding"], **EAGER)
    bodies = [{"shout": "hello"}, {"inputs": "HELLO"}, {"shout": 5}, {"inputs": "HELLO"}]
    answers = ask(handler, bodies, ["shout", "", "shout", "nowhere"])
    assert [status(handler.context, index) for index in range(4)] == [200, 200, 400, 404]
    (expected,) = ask(plain, [{"inputs": "HELLO"}])
    assert answers[0] == {"model": "test", "size": 32, "first": pytest.approx(expected["embedding"][0], abs=1e-6)}
    assert answers[1]["embedding"] == pytest.approx(expected["embedding"], abs=1e-6)
    assert answers[2] == {"problem": "send {'shout': text}"}  # the protocol's own error shape
    assert answers[3]["code"] == 404 and "/shout" in answers[3]["error"] and "/nowhere" in answers[3]["error"]


def test_every_answer_is_json_encoded_once_and_compact(plain):
    plain.context.request_processor = [RequestProcessor({"body": {"content-type": "application/json"}})]
    (sent,) = plain.handle([{"body": {"inputs": "hello"}}], plain.context)
    assert isinstance(sent, str) and "\n" not in sent and json.loads(sent)["embedding"]
    assert plain.context.get_response_content_type(0) == "application/json"


def sizes(path: Path) -> list[tuple[str, int, int]]:
    """(name, lines, limit) of every class (250) and function (50) of a module."""
    found = []
    for node in ast.walk(parsed(path)):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            limit = 250 if isinstance(node, ast.ClassDef) else 50
            found.append((f"{path.relative_to(PACKAGE.parent)}:{node.name}", node.end_lineno - node.lineno + 1, limit))
    return found


def test_no_class_of_the_served_package_is_over_250_lines_nor_a_function_over_50():
    measured = [entry for path in sorted(PACKAGE.rglob("*.py")) for entry in sizes(path)]
    assert len(measured) > 100
    assert [(name, lines) for name, lines, limit in measured if lines > limit] == []
