"""TEI's `embed_all` on an archive that keeps token states (`embedding.embed_all: true`): each
token's last hidden state as the model gives it, compiled and packed, embeddings pooled from the
same states equal to sentence-transformers, nothing recompiled after ready."""

import numpy as np
import pytest
import torch
from fakes import ready_handler
from sentence_transformers import SentenceTransformer
from test_adapters import ask
from transformers import AutoModel, AutoTokenizer

GRID = {"seq_lens": [8, 32], "batch_sizes": [1, 4]}
TEXTS = ["alice walks to paris", "the cat sat on the mat in berlin, zzz and more words here", "x"]


@pytest.fixture(scope="module")
def handler(tiny_bert):
    return ready_handler("embedding", tiny_bert, buckets=GRID, embedding={"embed_all": True})


def test_embed_all_answers_every_tokens_last_hidden_state(handler, tiny_bert):
    (answer,) = ask(handler, [{"inputs": TEXTS}], ["embed_all"])
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    model = AutoModel.from_pretrained(tiny_bert).eval()
    for text, states in zip(TEXTS, answer, strict=True):
        ids = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            wanted = model(**ids).last_hidden_state[0]
        got = torch.tensor(states)
        assert got.shape == wanted.shape  # every token, the special ones too
        assert torch.nn.functional.cosine_similarity(got, wanted, dim=-1).min() >= 0.9999
        assert torch.allclose(got, wanted, atol=1e-4)
    assert handler.engine.model.recompiles_after_ready == 0


def test_embeddings_pooled_from_token_states_equal_sentence_transformers(handler, tiny_bert):
    lengths = ["word " * count for count in (1, 3, 5, 7)]  # up to 30 tokens (4 a word): within the grid's 32
    answers = ask(handler, [{"inputs": TEXTS + lengths}, {"inputs": TEXTS, "normalize": False}])
    reference = SentenceTransformer(str(tiny_bert), device="cpu")
    for answer, normalize in zip(answers, (None, False), strict=True):
        got = torch.tensor(np.array([item["embedding"] for item in answer]))
        texts = TEXTS + lengths if normalize is None else TEXTS
        options = {} if normalize is None else {"normalize_embeddings": False}
        wanted = torch.as_tensor(reference.encode(texts, **options))
        assert torch.nn.functional.cosine_similarity(got, wanted, dim=-1).min() >= 0.9999
    assert handler.engine.model.recompiles_after_ready == 0


def test_embed_all_refuses_what_it_cannot_answer_and_its_batch_mates_are_answered(handler, tiny_bert):
    answers = ask(handler, [{"inputs": "a", "normalize": True}, {"inputs": ["b"]}], ["embed_all", "embed_all"])
    assert handler.context.get_response_status(0)[0] == 400 and "normalize" in answers[0]["error"]
    assert len(answers[1]) == 1 and len(answers[1][0]) == 3  # [CLS] b [SEP]
    pooled_in_graph = ready_handler("embedding", tiny_bert, buckets=GRID, compile={"enable": False})
    (refused,) = ask(pooled_in_graph, [{"inputs": "a"}], ["embed_all"])
    assert pooled_in_graph.context.get_response_status(0)[0] == 400
    assert "handler.embedding.embed_all: true" in refused["error"]
