"""Retrievers for ``search_qa``, shaped like Search-R1's ``/retrieve`` service.

Every retriever answers a batch of queries with, per query, a ranked list of hits in the JSON
shape of Search-R1's retrieval server (``search_r1/search/retrieval_server.py``)::

    {"document": {"id": "17", "contents": "\\"Title\\"\\ntext of the passage"}, "score": 12.3}

* ``BM25Retriever``: in-process BM25 (``bm25s``, Lucene-style scoring, k1=1.5, b=0.75) over a
  list of ``Document``. Tokens: lower-cased ``\\w\\w+`` runs minus bm25s's English stopwords,
  no stemming. Only documents sharing a term with the query are returned (a query with no known
  term returns no hits), as a Lucene BM25 server does. Ties break by document order, so the
  ranking is fully deterministic.
* ``HTTPRetriever``: POSTs ``{"queries": [...], "topk": k, "return_scores": true}`` to a running
  Search-R1 retrieval server (e.g. ``http://127.0.0.1:8000/retrieve``) with ``urllib`` and
  raises ``RetrieverError`` naming the URL and the cause when the server cannot be reached or
  answers something else than ``{"result": [[hit, ...], ...]}``.

``format_information(hits)`` renders hits the way Search-R1's ``_passages2string`` does: the
first line of ``contents`` is the title (with its quotes), the rest the text::

    Doc 1(Title: "Peathork Appliances") Peathork Appliances is a kitchen appliances company ...
    Doc 2(Title: "Sonzand") The Sonzand is a blender made by Peathork Appliances. ...

Example::

    >>> r = BM25Retriever([Document(id="0", title="Paris", text="Paris is the capital of France.")])
    >>> r.retrieve(["capital of France"], topk=3)[0][0]["document"]["id"]
    '0'
"""

from __future__ import annotations

import abc
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict


class RetrieverError(RuntimeError):
    """The retrieval backend failed (server down, bad reply); never raised for a bad query."""


class DocumentDict(TypedDict):
    id: str
    contents: str  # '"Title"\ntext', as in Search-R1's wiki-18 corpus


class Hit(TypedDict):
    document: DocumentDict
    score: float


@dataclass(frozen=True, slots=True)
class Document:
    """One passage of a corpus."""

    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        return f'"{self.title}"\n{self.text}'

    def as_dict(self) -> DocumentDict:
        return {"id": self.id, "contents": self.contents}


def split_contents(contents: str) -> tuple[str, str]:
    """(title line, text) of a Search-R1 ``contents`` string; the title keeps its quotes."""
    title, _, text = contents.partition("\n")
    return title, text


def format_information(hits: Sequence[Hit]) -> str:
    """Search-R1's ``_passages2string``: one ``Doc i(Title: ...) text`` line per hit."""
    lines = []
    for i, hit in enumerate(hits, start=1):
        title, text = split_contents(hit["document"]["contents"])
        lines.append(f"Doc {i}(Title: {title}) {text}\n")
    return "".join(lines)


class Retriever(abc.ABC):
    """Answers a batch of queries with up to ``topk`` hits each, best first."""

    @abc.abstractmethod
    def retrieve(self, queries: list[str], topk: int = 3) -> list[list[Hit]]:
        """One list of hits per query, in query order."""


# ----- BM25 -----------------------------------------------------------------------------------------
_TOKEN = re.compile(r"(?u)\b\w\w+\b")  # scikit-learn's / bm25s's default token pattern


def _stopwords() -> frozenset[str]:
    from bm25s.stopwords import STOPWORDS_EN

    return frozenset(STOPWORDS_EN)


class BM25Retriever(Retriever):
    """BM25 over an in-memory list of documents (bm25s sparse index; built once, read-only)."""

    def __init__(self, docs: Sequence[Document]):
        import bm25s

        if not docs:
            raise ValueError("BM25Retriever needs at least one document")
        self.docs = list(docs)
        self._stop = _stopwords()
        self._index = bm25s.BM25()
        self._index.index([self.tokenize(d.contents) for d in self.docs], show_progress=False)
        self._lock = threading.Lock()  # bm25s scoring is not documented as thread-safe

    def tokenize(self, text: str) -> list[str]:
        return [t for t in _TOKEN.findall(text.lower()) if t not in self._stop]

    def scores(self, query: str):
        """BM25 score of every document for ``query`` (numpy array), or None when no term is known."""
        ids = self._index.get_tokens_ids(self.tokenize(query))
        if not ids:
            return None
        with self._lock:
            return self._index.get_scores_from_ids(ids)

    def rank(self, query: str, topk: int) -> list[tuple[int, float]]:
        """(document index, score) of the best ``topk`` documents with a positive score."""
        import numpy as np

        scores = self.scores(query)
        if scores is None or topk <= 0:
            return []
        hits = np.flatnonzero(scores > 0)
        if hits.size > topk:  # keep every candidate tied with the k-th best, then order exactly
            kth = np.partition(scores[hits], hits.size - topk)[hits.size - topk]
            hits = hits[scores[hits] >= kth]
        order = hits[np.lexsort((hits, -scores[hits]))][:topk]
        return [(int(i), float(scores[i])) for i in order]

    def retrieve(self, queries: list[str], topk: int = 3) -> list[list[Hit]]:
        return [[{"document": self.docs[i].as_dict(), "score": s} for i, s in self.rank(str(q), topk)] for q in queries]


# ----- HTTP (Search-R1 retrieval server) ------------------------------------------------------------
class HTTPRetriever(Retriever):
    """Client of a Search-R1 ``/retrieve`` endpoint (``retrieval_server.py`` or compatible)."""

    def __init__(self, url: str, *, timeout_s: float = 30.0, retries: int = 2):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(
                f"search_qa HTTP retriever needs an http(s) URL such as 'http://127.0.0.1:8000/retrieve', got {url!r}"
            )
        if timeout_s <= 0 or retries < 0:
            raise ValueError(
                f"search_qa HTTP retriever needs timeout_s > 0 and retries >= 0 (got {timeout_s}, {retries})"
            )
        self.url, self.timeout_s, self.retries = url, float(timeout_s), int(retries)

    def retrieve(self, queries: list[str], topk: int = 3) -> list[list[Hit]]:
        queries = [str(q) for q in queries]
        if not queries:
            return []
        body = json.dumps({"queries": queries, "topk": int(topk), "return_scores": True}).encode()
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(0.5 * 2 ** (attempt - 1), 4.0))
            try:
                request = urllib.request.Request(
                    self.url, data=body, method="POST", headers={"Content-Type": "application/json"}
                )
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    payload = response.read()
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code} {e.reason}"
                if e.code < 500:  # the request itself is wrong; retrying will not help
                    break
                continue
            except (urllib.error.URLError, OSError) as e:  # refused, DNS, timeout
                last = str(getattr(e, "reason", e))
                continue
            return self._parse(payload, len(queries))
        raise RetrieverError(
            f"search_qa: the retrieval server at {self.url} failed after {self.retries + 1} attempt(s): "
            f"{last}. Start a Search-R1 retrieval server (search_r1/search/retrieval_server.py) there, "
            f"or set env.options.retriever=bm25"
        )

    def _parse(self, payload: bytes, n_queries: int) -> list[list[Hit]]:
        def bad(why: str) -> RetrieverError:
            return RetrieverError(
                f"search_qa: the retrieval server at {self.url} sent an unexpected reply "
                f'({why}); expected {{"result": [[{{"document": {{"id", "contents"}}, '
                f'"score"}}, ...], ...]}} with one list per query'
            )

        try:
            data = json.loads(payload)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise bad(f"not JSON: {e}") from None
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list) or len(result) != n_queries:
            raise bad(f"'result' is not a list of {n_queries} lists")
        out: list[list[Hit]] = []
        for hits in result:
            if not isinstance(hits, list):
                raise bad("a query's hits are not a list")
            parsed: list[Hit] = []
            for hit in hits:
                # With return_scores the server sends {"document", "score"}; without, bare documents.
                doc = hit.get("document", hit) if isinstance(hit, dict) else None
                if not isinstance(doc, dict) or not isinstance(doc.get("contents"), str):
                    raise bad("a hit has no document.contents string")
                score = hit.get("score", 0.0) if isinstance(hit, dict) else 0.0
                parsed.append(
                    {
                        "document": {"id": str(doc.get("id", "")), "contents": doc["contents"]},
                        "score": float(score) if isinstance(score, (int, float)) else 0.0,
                    }
                )
            out.append(parsed)
        return out
