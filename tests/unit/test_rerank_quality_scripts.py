"""The pieces of benchmarks/distilled_reranker.py and benchmarks/int8_rerank_quality.py that decide
what is measured: the prose they train and rank on, the queries made of it, and the agreement
figures. (Training itself takes about 18 minutes on 2 cores: a documented run, not a test.)"""

import random

import pytest
import torch

from ts_compiled_handlers.benchmarks import distilled_reranker
from ts_compiled_handlers.benchmarks.int8_rerank_quality import agreement


def test_paragraphs_keep_prose_and_drop_code_lists_and_short_lines():
    prose = " ".join(["The parser reads each token of the input and builds the tree from them."] * 3)
    text = f"{prose}\n\n   indented = code(x) {prose}\n\n* a list item {prose}\n\ntoo short here."
    assert distilled_reranker.paragraphs(text) == [prose]


def test_the_corpus_is_python_s_documentation_in_prose_paragraphs_each_once():
    passages = distilled_reranker.corpus()
    assert len(passages) > 1000 and len(set(passages)) == len(passages)
    assert all(25 <= len(passage.split()) <= 160 for passage in passages)


def test_each_passage_gives_a_sentence_query_taken_out_of_it_and_a_keyword_query_of_its_words():
    passages = [
        "The first sentence says what the parser does with tokens. Then a second sentence explains the grammar "
        "rules it follows when reading input. A third one is here too.",
        "Sockets carry bytes between processes over a network connection.",
    ]
    pairs = distilled_reranker.queries(passages, seed=1)
    sources = [source for _, _, source in pairs]
    assert sources == [0, 0, 1]  # the second passage has one sentence: a keyword query only
    sentence, without, _ = pairs[0]
    assert sentence in passages[0] and sentence not in without and len(without) < len(passages[0])
    for query, passage, source in pairs[1:]:
        assert passage == passages[source] and 3 <= len(query.split()) <= 5
        assert all(word in passage.lower() for word in query.split())


def test_agreement_counts_queries_whose_order_first_and_top_three_match_and_pairs_ordered_alike():
    reference = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0, 4.0]])
    swapped_last = torch.tensor([[4.0, 3.0, 2.0, 0.0, 1.0], [0.0, 1.0, 2.0, 3.0, 4.0]])  # query 0's last two swap
    found = agreement(reference, swapped_last)
    assert found["same_order"] == 0.5 and found["same_first"] == 1.0 and found["same_top3"] == 1.0
    assert found["pairwise"] == pytest.approx(19 / 20) and found["max_logit_error"] == 1.0
    assert found["own_passage_first"] == 0.5  # candidate 0 (the query's passage) first for query 0 only
    third_swapped = agreement(reference, torch.tensor([[4.0, 3.0, 1.0, 2.0, 0.0], [0.0, 1.0, 2.0, 3.0, 4.0]]))
    assert third_swapped["same_top3"] == 0.5 and third_swapped["same_first"] == 1.0
    shuffled = reference[:, torch.tensor(random.Random(0).sample(range(5), 5))]
    assert agreement(reference, reference)["same_order"] == 1.0 and agreement(reference, -reference)["pairwise"] == 0
    assert agreement(shuffled, shuffled)["same_order"] == 1.0
