"""Every rerank shape (handlers/protocols/rerank_routes.py) sent to one archive that ranks, in
process: each answers the scores of the archive's own `rerank` body, best first, with `top_n` and
the documents as that shape asks; the `cohere` client's v1 and v2 `rerank` read their answers
(its requests answered by the handler through httpx's MockTransport); bad bodies get a 4xx in
each shape's error body, their batch-mate answered."""

import json

import cohere
import httpx
import pytest
from fakes import status
from test_adapters import ask

MODEL = "test"  # the name the in-process context registers (benchmarks/in_process.py)


def shapes(query: str, documents: list[str], params: dict) -> dict[str, dict]:
    """A body of each shape, by its route, each asking for the two best with their documents."""
    cohere_v2 = {"model": MODEL, "query": query, "documents": documents, "top_n": 2, **params}
    return {
        "": {"query": query, "documents": documents, "top_n": 2, "return_documents": True, **params},
        "rerank": {"query": query, "texts": documents, "return_text": True, "raw_scores": False, **params},
        "v1/rerank": {**cohere_v2, "return_documents": True},  # Cohere's v1 and Jina's
        "v2/rerank": cohere_v2,
    }


def assert_every_shape_ranks_as_rerank(handler, query: str, documents: list[str], params: dict) -> dict:
    """Each shape's answer against the archive's own `rerank` body's; its scores by index."""
    (own,) = ask(handler, [{"query": query, "documents": documents, **params}], ["rerank"])
    scores = {one["index"]: one["score"] for one in own}
    order = [one["index"] for one in own]
    assert order == sorted(range(len(documents)), key=lambda index: -scores[index])
    top = order[:2]
    bodies = shapes(query, documents, params)
    ours, tei, v1, v2 = ask(handler, list(bodies.values()), list(bodies))
    assert [status(handler.context, index) for index in range(4)] == [200] * 4
    assert [(one["index"], one["document"]) for one in ours] == [(index, documents[index]) for index in top]
    assert [(one["index"], one["text"]) for one in tei] == [(index, documents[index]) for index in order]
    assert [(one["index"], one["document"]["text"]) for one in v1["results"]] == [(i, documents[i]) for i in top]
    assert v1["model"] == MODEL and set(v1) == {"model", "results", "usage"}
    assert [one["index"] for one in v2["results"]] == top and "document" not in v2["results"][0]
    assert set(v2) == {"id", "results", "meta"} and v2["meta"]["api_version"] == {"version": "2"}
    got = [one["score"] for one in ours + tei] + [one["relevance_score"] for one in v1["results"] + v2["results"]]
    assert got == pytest.approx([scores[index] for index in top + order + top + top], abs=1e-5)
    return scores


def cohere_clients(handler) -> tuple[cohere.Client, cohere.ClientV2]:
    """The `cohere` package's v1 and v2 clients, based at the archive's path, answered by `handler`."""

    def answer(request: httpx.Request) -> httpx.Response:
        route = request.url.path.removeprefix(f"/predictions/{MODEL}/1.0/")
        (body,) = ask(handler, [json.loads(request.content)], [route])
        return httpx.Response(status(handler.context, 0), json=body)

    base, key = f"http://archive/predictions/{MODEL}/1.0", "inference-key"
    transport = httpx.MockTransport(answer)
    return (
        cohere.Client(api_key=key, base_url=base, httpx_client=httpx.Client(transport=transport)),
        cohere.ClientV2(api_key=key, base_url=base, httpx_client=httpx.Client(transport=transport)),
    )


def assert_cohere_clients_read_the_ranking(handler, query: str, documents: list[str], params: dict, scores: dict):
    """Both clients' `rerank`: the best two, scored as `scores`; a refusal raised as their 400."""
    order = sorted(scores, key=lambda index: -scores[index])[:2]
    extra = {"additional_body_parameters": params}  # the task's own parameters (bge-m3's weights)
    v1, v2 = cohere_clients(handler)
    first = v1.rerank(
        model=MODEL, query=query, documents=documents, top_n=2, return_documents=True, request_options=extra
    )
    assert [(one.index, one.document.text) for one in first.results] == [(index, documents[index]) for index in order]
    second = v2.rerank(model=MODEL, query=query, documents=documents, top_n=2, request_options=extra)
    assert [one.index for one in second.results] == order
    wanted = [scores[index] for index in order] * 2
    assert [one.relevance_score for one in first.results + second.results] == pytest.approx(wanted, abs=1e-5)
    with pytest.raises(cohere.BadRequestError):
        v2.rerank(model=MODEL, query=query, documents=[])


REFUSED = [  # (route, body, status, the error body's keys): one of each shape's refusals
    ("", {"query": "q", "documents": "a"}, 400, {"error", "code"}),
    ("rerank", {"query": 5, "texts": ["a"]}, 422, {"error", "code"}),  # TEI's status, the route's last shape (ours)
    ("rerank", {"query": "q", "documents": ["a"], "top_n": 0}, 400, {"error", "code"}),
    ("v1/rerank", {"model": MODEL, "query": "q"}, 400, {"error"}),
    ("v1/rerank", {"model": "other", "query": "q", "documents": ["a"]}, 404, {"error"}),
    ("v2/rerank", {"model": MODEL, "query": "q", "documents": ["a"], "max_tokens_per_doc": 8}, 400, {"message"}),
    ("v2/rerank", ["q", "a"], 400, {"message"}),
]


def assert_bad_bodies_are_refused_alone(handler, query: str, documents: list[str]):
    good = {"query": query, "documents": documents}
    answers = ask(handler, [body for _, body, _, _ in REFUSED] + [good], [route for route, *_ in REFUSED] + [""])
    for index, ((route, _, wanted, keys), answer) in enumerate(zip(REFUSED, answers, strict=False)):
        assert (status(handler.context, index), set(answer)) == (wanted, keys), (route, answer)
    assert status(handler.context, len(REFUSED)) == 200 and len(answers[-1]) == len(documents)
