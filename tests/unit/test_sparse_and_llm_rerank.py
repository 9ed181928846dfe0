"""SPLADE pooling in vocabulary slices, and LLM rerankers' LogitScore and pair texts, against
sentence-transformers' own modules, in process (the server tests: tests/integration/
test_sparse_and_llm_rerank_server.py)."""

import json

import pytest
import torch
from fakes import ready_handler
from rerank_shapes import (
    assert_bad_bodies_are_refused_alone,
    assert_cohere_clients_read_the_ranking,
    assert_every_shape_ranks_as_rerank,
)
from sentence_transformers import CrossEncoder
from sentence_transformers.sparse_encoder.modules import SpladePooling
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

from ts_compiled_handlers.configuration.placement import Placement
from ts_compiled_handlers.engine.packing import PackedModel, pack_rows
from ts_compiled_handlers.graphs import logit_score, splade
from ts_compiled_handlers.loops.request_batches import RequestBatches
from ts_compiled_handlers.request.tokenizing import TextTokenizer
from ts_compiled_handlers.tasks.classification import ClassificationTask
from ts_compiled_handlers.worker.messages import Incoming
from ts_compiled_handlers.worker.worker import Worker

TEXTS = ["hello world", "the cat sat on the red mat", "alice walks to paris and bob runs to london", "a"]
QUERY = "where does alice walk"
DOCUMENTS = ["alice walks to paris", "the cat sat on the mat", "bob runs to london with carol"]


def batch(tokenizer, texts):
    encoded = tokenizer(texts, padding=True, return_tensors="pt")
    return encoded["input_ids"], encoded["attention_mask"]


def masked_lm(folder):
    return AutoModelForMaskedLM.from_pretrained(folder).eval()


@pytest.mark.parametrize("strategy", splade.STRATEGIES)
@pytest.mark.parametrize("activation", splade.ACTIVATIONS)
def test_sliced_pooling_equals_splade_pooling_alone_and_packed(tiny_models, strategy, activation):
    folder = tiny_models["sparse-embedding"]
    input_ids, mask = batch(AutoTokenizer.from_pretrained(folder), TEXTS)
    with torch.no_grad():
        logits = masked_lm(folder)(input_ids=input_ids, attention_mask=mask).logits
        reference = SpladePooling(strategy, activation)({"token_embeddings": logits, "attention_mask": mask})
        encoder = splade.SpladeEncoder(masked_lm(folder), strategy, activation, slices=7).eval()
        alone = encoder(input_ids, mask)
        assert torch.allclose(alone, reference["sentence_embedding"], atol=1e-6)
        # packed: every text laid end to end in rows, each pooled over its own tokens
        lengths = mask.sum(dim=1).tolist()
        rows = pack_rows(lengths, 64, (64,))
        ids, positions, segments = (torch.zeros(len(rows), 64, dtype=torch.long) for _ in range(3))
        for row, texts in enumerate(rows):
            at = 0
            for slot, text in enumerate(texts, start=1):
                ids[row, at : at + lengths[text]] = input_ids[text, : lengths[text]]
                positions[row, at : at + lengths[text]] = torch.arange(lengths[text])
                segments[row, at : at + lengths[text]] = slot
                at += lengths[text]
        packed = PackedModel(encoder)(ids, positions, segments)
        for row, texts in enumerate(rows):
            for slot, text in enumerate(texts):
                assert torch.allclose(packed[row, slot], alone[text], atol=1e-5)


class LargestOutput(TorchDispatchMode):
    """The most elements any one operation made while the mode was on."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(tensor, torch.Tensor):
                self.largest = max(self.largest, tensor.numel())
        return out


def test_a_call_holds_one_vocabulary_slice_of_logits_at_a_time(tiny_models):
    folder = tiny_models["sparse-embedding"]
    config = AutoModelForMaskedLM.from_pretrained(folder).config
    vocabulary = config.vocab_size
    input_ids, mask = batch(AutoTokenizer.from_pretrained(folder), TEXTS * 4)  # 16 texts
    tokens = input_ids.numel()
    found = {}
    for slices in (1, 8):
        encoder = splade.SpladeEncoder(masked_lm(folder), "max", "relu", slices).eval()
        with torch.no_grad(), LargestOutput() as watch:
            found[slices] = encoder(input_ids, mask)
        found[f"largest {slices}"] = watch.largest
    assert found["largest 1"] == tokens * vocabulary  # unsliced: every token's logits at once
    # sliced: one slice's logits, or the model's own widest activation (its feed-forward layer)
    assert found["largest 8"] <= max(tokens * -(-vocabulary // 8), tokens * config.intermediate_size)
    assert found["largest 8"] < found["largest 1"]
    assert torch.equal(found[1], found[8])
    # BERT's 30,522 words at the default grid's fullest call (32 x 512 tokens): 64 MiB slices
    slices = splade.slices_for(30522, 32 * 512)
    assert 32 * 512 * -(-30522 // slices) * 4 <= splade.SLICE_BYTES and slices == 30


def test_the_score_is_logit_yes_minus_no_at_the_last_real_token(tiny_models):
    folder = tiny_models["reranker-causal"]
    tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="right")  # as the engine pads
    yes, no = logit_score.score_token_ids(folder, tokenizer)
    assert (yes, no) == (tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no"))
    causal_lm = AutoModelForCausalLM.from_pretrained(folder).eval()
    input_ids, mask = batch(tokenizer, TEXTS)
    with torch.no_grad():
        scores = logit_score.CausalLogitScore(causal_lm, yes, no)(input_ids, mask).squeeze(1)
        only_yes = logit_score.CausalLogitScore(causal_lm, yes, None)(input_ids, mask).squeeze(1)
        for text, score, yes_logit in zip(TEXTS, scores, only_yes, strict=True):
            alone = causal_lm(**tokenizer(text, return_tensors="pt")).logits[0, -1]
            assert score.item() == pytest.approx((alone[yes] - alone[no]).item(), abs=1e-5)
            assert yes_logit.item() == pytest.approx(alone[yes].item(), abs=1e-5)


def test_a_causal_lm_without_yes_and_no_tokens_is_refused_by_name(tmp_path, tiny_models):
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["text-generation"])
    with pytest.raises(ValueError, match="no token 'yes' or 'no'"):
        logit_score.score_token_ids(tmp_path, tokenizer)
    (tmp_path / "modules.json").write_text(json.dumps([{"path": "1_LogitScore", "type": "x.LogitScore"}]))
    (tmp_path / "1_LogitScore").mkdir()
    (tmp_path / "1_LogitScore" / "config.json").write_text(json.dumps({"true_token_id": 7, "false_token_id": None}))
    assert logit_score.score_token_ids(tmp_path, tokenizer) == (7, None)


def test_a_chat_template_reranker_scores_its_rendered_pairs_as_cross_encoder(tiny_models):
    """Saved by CrossEncoder with a default prompt and a query/document chat template: each pair is
    rendered (the prompt a system message), tokenized as rendered, and never cut."""
    folder = tiny_models["reranker-causal-chat"]
    expected = CrossEncoder(str(folder), device="cpu").predict([(QUERY, document) for document in DOCUMENTS])
    handler = {
        "dtype": "float32",
        "buckets": {"seq_lens": [32, 128], "batch_sizes": [1, 4]},
        "compile": {"enable": False},
    }
    worker = Worker.build(
        Placement(str(folder), "chat", {"handler": {**handler, "task": "text-classification"}}), ClassificationTask
    )
    assert worker.task.pair_texts.chat and worker.task.prompts == {"relevance": "does the document answer the query"}
    long = {"query": QUERY, "documents": ["alice " * 200], "truncate": True}
    bodies = [{"query": QUERY, "documents": DOCUMENTS}, long]
    ranked, refused = RequestBatches(worker).serve_batch(
        [Incoming(json.dumps(body).encode(), "application/json") for body in bodies]
    )
    assert ranked.status == 200, ranked.body
    scores = {item["index"]: item["score"] for item in json.loads(ranked.body)}
    assert [scores[index] for index in range(len(DOCUMENTS))] == pytest.approx(expected.tolist(), abs=1e-5)
    assert refused.status == 413 and "no cut" in json.loads(refused.body)["error"]


def test_every_rerank_shape_answers_an_llm_rerankers_scores(tiny_models):
    """Ours, TEI's `rerank`, Cohere's and Jina's `v1/rerank`, Cohere's `v2/rerank` (and its client)."""
    folder = tiny_models["reranker-causal-chat"]
    expected = CrossEncoder(str(folder), device="cpu").predict([(QUERY, document) for document in DOCUMENTS])
    buckets = {"seq_lens": [32, 128], "batch_sizes": [1, 4]}
    handler = ready_handler("text-classification", folder, buckets=buckets, compile={"enable": False})
    scores = assert_every_shape_ranks_as_rerank(handler, QUERY, DOCUMENTS, {})
    assert [scores[index] for index in range(len(DOCUMENTS))] == pytest.approx(expected.tolist(), abs=1e-5)
    assert_cohere_clients_read_the_ranking(handler, QUERY, DOCUMENTS, {}, scores)
    assert_bad_bodies_are_refused_alone(handler, QUERY, DOCUMENTS)


def test_a_template_that_cannot_carry_a_pair_leaves_pairs_as_two_texts(tiny_models, caplog):
    folder = tiny_models["text-generation"]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}{% endif %}{% endfor %}"
    )
    from ts_compiled_handlers.tasks.pair_texts import PairTexts

    texts = PairTexts(folder, tokenizer, {}, None)
    assert not texts.chat and "cannot carry query/document" in caplog.text
    assert texts([("q", "d")]) == [("q", "d")]
    assert PairTexts(folder, tokenizer, {"p": "find: "}, "p")([("q", "d")]) == [("find: q", "d")]


def test_rendered_texts_get_no_special_tokens_and_are_never_cut(tiny_models):
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["embedding"])
    plain = TextTokenizer(tokenizer, 8, reject=False)
    rendered = TextTokenizer(tokenizer, 8, reject=False, special_tokens=False, truncates=False)
    assert plain(["hello world"]).token_ids[0] == [tokenizer.cls_token_id, *rendered(["hello world"]).token_ids[0], 3]
    assert len(plain(["the cat " * 10], truncate=True).token_ids[0]) == 8
    with pytest.raises(Exception, match="no cut"):
        rendered(["the cat " * 10], truncate=True)


def test_an_answer_too_large_for_torchserve_is_refused_for_that_request_only():
    """64 texts of a SPLADE model fit max_response_size; an answer past the answer budget (a model
    that activates its whole vocabulary) gets a 413 that says what to send, not a dropped connection,
    before its entries are listed."""
    from types import SimpleNamespace

    from ts_compiled_handlers.configuration.config import parse
    from ts_compiled_handlers.protocols.plain import PlainProtocol
    from ts_compiled_handlers.request.payload import RequestError
    from ts_compiled_handlers.tasks.sparse_embedding import ENTRY_BYTES, SparseEmbeddingTask

    config = parse({"handler": {"task": "sparse-embedding"}})
    task = SparseEmbeddingTask(config)
    task.max_active_dims = None
    rows = [torch.rand(30522) + 0.01 for _ in range(config.max_response_bytes // ENTRY_BYTES // 30522 + 1)]
    with pytest.raises(RequestError, match="send top_k or threshold") as refused:
        task.answer(SimpleNamespace(request=SimpleNamespace(params={}, protocol=PlainProtocol())), rows)
    assert refused.value.status == 413 and refused.value.field == "top_k"
    kept = task.answer(SimpleNamespace(request=SimpleNamespace(params={"top_k": 300}, protocol=PlainProtocol())), rows)
    assert [len(answer.indices) for answer in kept] == [300] * len(rows)
    assert all(answer.indices == sorted(answer.indices) for answer in kept)
