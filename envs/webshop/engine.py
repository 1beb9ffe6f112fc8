"""WebShop's page graph in text mode, over a generated catalog, with BM25 search (``bm25s``).

Pages and what can be done on them (clickables are lower-cased, as WebShop lower-cases button
text and ASINs)::

    search   has the search bar: search[keywords]
    results  back to search | < prev (page > 1) | next > (more results) | the ASINs shown
    item     back to search | < prev (-> results) | option values | description | features
             | reviews | buy now
    sub      (description / features / reviews) back to search | < prev (-> item, options kept)
    done     nothing (after buy now)

Search ranks the catalog by BM25 over each product's lower-cased title + description + first
bullet + options and keeps the top 50 with a positive score, 10 per page. ``back to search``
forgets the query and the chosen options; opening an item from the results starts with no
options chosen; clicking an option value sets that option (one value per option name).

Observation: the page's visible texts joined with ``" [SEP] "``; every page starts with
``Instruction: [SEP] <instruction>``. A real results page (seed 1858 of the train split, 400
products, after ``search[men's t-shirt cotton short sleeve]``; shortened)::

    Instruction: [SEP] i want to buy a men's t-shirt which is crew neck, short sleeve and cotton with
    color: royal blue, and size: large, and price lower than 50.00 dollars [SEP] Back to Search
    [SEP] Page 1 (Total results: 37) [SEP] Next > [SEP] B0EQCFRM6X [SEP] Lakeview Apparel Short
    Sleeve Crew Neck Men's T-Shirt [SEP] $15.99 [SEP] B0JL0G5JRY [SEP] Fieldstone Tagless Short
    Sleeve Men's T-Shirt [SEP] $26.49 [SEP] ...

Deviations from WebShop's text env: the search page has no ``WebShop`` logo text before
``Instruction:`` and does not list its ``search`` button among the clickables (WebShop lists it
but refuses ``click[search]``); tokens are lower-cased, stop-word-filtered words of two or more
characters with a light plural stemmer (``-ies -> -y``, ``-sses -> -ss``, final ``-s``), not
Pyserini's Lucene analyser with Porter stemming; ties in score go to catalog order; the done page
shows the purchase and its score only. An action that cannot run changes nothing and returns
``False`` (WebShop returns the same page with reward 0).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from enum import StrEnum

import bm25s
import numpy as np

from envs.webshop.catalog import Catalog, Product, build_catalog

SEP = " [SEP] "
TOP_K = 50
PER_PAGE = 10
BACK_TO_SEARCH, NEXT_PAGE, PREV_PAGE, BUY_NOW = "back to search", "next >", "< prev", "buy now"
SUB_PAGES = ("description", "features", "reviews")

_TOKEN = re.compile(r"(?u)\b\w\w+\b")
_STOPWORDS = frozenset(bm25s.stopwords.STOPWORDS_EN)
_ACTION = re.compile(r"^(search|click)\[(.*)\]$", re.DOTALL)


def stem(word: str) -> str:
    """A light plural stemmer (Harman's S-stemmer)."""
    if word.endswith("ies") and len(word) > 4 and not word.endswith(("eies", "aies")):
        return word[:-3] + "y"
    if word.endswith("sses"):
        return word[:-2]
    if word.endswith("s") and len(word) > 3 and not word.endswith(("us", "ss", "is")):
        return word[:-1]
    return word


def tokenize(text: str) -> list[str]:
    return [stem(w) for w in _TOKEN.findall(text.lower()) if w not in _STOPWORDS]


class SearchIndex:
    """BM25 over the catalog's search texts; ``search`` is deterministic (ties: catalog order)."""

    def __init__(self, catalog: Catalog):
        self.asins = [p.asin for p in catalog.products]
        vocab: dict[str, int] = {}
        ids = [[vocab.setdefault(t, len(vocab)) for t in tokenize(p.search_text())] for p in catalog.products]
        self.bm25 = bm25s.BM25()
        self.bm25.index((ids, vocab), show_progress=False)

    def search(self, query: str, k: int = TOP_K) -> list[str]:
        tokens = tokenize(query)
        if not tokens:
            return []
        scores = self.bm25.get_scores(tokens)
        order = np.lexsort((np.arange(len(scores)), -scores))  # by score desc, then catalog order
        return [self.asins[i] for i in order[:k] if scores[i] > 0]

    def rank(self, query: str, asin: str) -> int | None:
        """0-based position of ``asin`` among the results of ``query`` (None if not in the top 50)."""
        results = self.search(query)
        return results.index(asin) if asin in results else None


@functools.lru_cache(maxsize=8)
def catalog_and_index(seed: int, n_products: int) -> tuple[Catalog, SearchIndex]:
    """The generated catalog and its index, built once per process for each (seed, size)."""
    catalog = build_catalog(seed, n_products)
    return catalog, SearchIndex(catalog)


class Page(StrEnum):
    SEARCH = "search"
    RESULTS = "results"
    ITEM = "item"
    SUB = "sub"
    DONE = "done"


def parse_action(action: str) -> tuple[str, str] | None:
    """``("search"|"click", argument)`` from ``name[argument]``; None if it has another shape."""
    m = _ACTION.match(action.strip()) if isinstance(action, str) else None
    if m is None or not m.group(2).strip():
        return None
    return m.group(1), m.group(2).strip()


def price_text(price: float) -> str:
    return f"${price:.2f}"


@dataclass
class ShopSession:
    """The browsing state of one episode."""

    page: Page = Page.SEARCH
    keywords: str = ""
    results: list[str] = field(default_factory=list)  # ranked ASINs of the last search
    page_no: int = 1
    asin: str = ""  # the open product
    options: dict[str, str] = field(default_factory=dict)  # option name -> chosen value
    sub_page: str = ""


class WebShopEngine:
    """One shopper's session over a catalog. ``execute`` never raises on bad input."""

    def __init__(self, catalog: Catalog, index: SearchIndex, instruction: str):
        self.catalog = catalog
        self.index = index
        self.instruction = instruction
        self.state = ShopSession()
        self.purchase: tuple[Product, dict[str, str]] | None = None

    # ----- what is on the page -------------------------------------------------------------------
    @property
    def product(self) -> Product | None:
        return self.catalog.by_asin.get(self.state.asin)

    def shown(self) -> list[str]:
        """The ASINs listed on the current results page."""
        start = (self.state.page_no - 1) * PER_PAGE
        return self.state.results[start : start + PER_PAGE]

    def get_available_actions(self) -> dict:
        """WebShop's ``{"has_search_bar": bool, "clickables": [str]}`` for the current page."""
        s = self.state
        clickables: list[str] = []
        if s.page is Page.RESULTS:
            clickables.append(BACK_TO_SEARCH)
            if s.page_no > 1:
                clickables.append(PREV_PAGE)
            if s.page_no * PER_PAGE < len(s.results):
                clickables.append(NEXT_PAGE)
            clickables += [a.lower() for a in self.shown()]
        elif s.page is Page.ITEM:
            clickables += [BACK_TO_SEARCH, PREV_PAGE]
            clickables += [v for values in self.product.options.values() for v in values]
            clickables += [*SUB_PAGES, BUY_NOW]
        elif s.page is Page.SUB:
            clickables += [BACK_TO_SEARCH, PREV_PAGE]
        return {"has_search_bar": s.page is Page.SEARCH, "clickables": clickables}

    def observation(self) -> str:
        s = self.state
        parts = ["Instruction:", self.instruction]
        if s.page is Page.SEARCH:
            parts.append("Search")
        elif s.page is Page.RESULTS:
            parts += ["Back to Search", f"Page {s.page_no} (Total results: {len(s.results)})"]
            if s.page_no > 1:
                parts.append("< Prev")
            if s.page_no * PER_PAGE < len(s.results):
                parts.append("Next >")
            for asin in self.shown():
                p = self.catalog.by_asin[asin]
                parts += [asin, p.title, price_text(p.price)]
        elif s.page is Page.ITEM:
            p = self.product
            parts += ["Back to Search", "< Prev"]
            for name, values in p.options.items():
                parts += [name, *values]
            parts += [
                p.title,
                f"Price: {price_text(p.price)}",
                f"Rating: {p.rating}",
                "Description",
                "Features",
                "Reviews",
                "Buy Now",
            ]
        elif s.page is Page.SUB:
            p = self.product
            parts += ["Back to Search", "< Prev"]
            if s.sub_page == "description":
                parts.append(p.description)
            elif s.sub_page == "features":
                parts += list(p.bullets)
            else:
                for r in p.reviews:
                    parts += [r.title, f"{r.score} out of 5 stars", r.body]
        else:
            product, options = self.purchase
            chosen = ", ".join(f"{k}: {v}" for k, v in options.items()) or "none"
            parts += ["Thank you for shopping with us!", "Purchased", product.asin, product.title, f"Options: {chosen}"]
        return SEP.join(parts)

    # ----- acting --------------------------------------------------------------------------------
    def execute(self, action: str) -> tuple[bool, str]:
        """Apply ``search[...]`` or ``click[...]``: ``(True, "")``, or ``(False, why)`` and no change."""
        parsed = parse_action(action)
        if parsed is None:
            return False, "not of the form search[...] or click[...]"
        name, arg = parsed
        avail = self.get_available_actions()
        s = self.state
        if name == "search":
            if not avail["has_search_bar"]:
                return False, "no search bar on this page"
            s.keywords, s.results, s.page_no = arg, self.index.search(arg), 1
            s.page, s.asin, s.options = Page.RESULTS, "", {}
            return True, ""
        if arg not in avail["clickables"]:
            return False, f"{arg!r} is not clickable on this page"
        if arg == BACK_TO_SEARCH:
            self.state = ShopSession()
        elif s.page is Page.RESULTS:
            if arg == NEXT_PAGE:
                s.page_no += 1
            elif arg == PREV_PAGE:
                s.page_no -= 1
            else:
                s.page, s.asin, s.options = Page.ITEM, arg.upper(), {}
        elif s.page is Page.ITEM:
            if arg == PREV_PAGE:
                s.page, s.asin, s.options = Page.RESULTS, "", {}
            elif arg in SUB_PAGES:
                s.page, s.sub_page = Page.SUB, arg
            elif arg == BUY_NOW:
                self.purchase = (self.product, dict(s.options))
                s.page = Page.DONE
            else:
                s.options[self._option_name(arg)] = arg
        elif s.page is Page.SUB:  # only < prev is left
            s.page, s.sub_page = Page.ITEM, ""
        return True, ""

    def _option_name(self, value: str) -> str:
        return next(name for name, values in self.product.options.items() if value in values)

    @property
    def done(self) -> bool:
        return self.state.page is Page.DONE
