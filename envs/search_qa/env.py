"""``search_qa``: Search-R1's tag protocol over a searchable corpus, scored by exact match.

Each turn the model writes free text holding ONE action:

* ``<search> query </search>``: the retriever's top ``topk`` (3) documents come back as the next
  observation, ``<information>Doc 1(Title: "...") text\\nDoc 2(...) ...</information>``;
* ``<answer> text </answer>``: ends the episode; reward = exact match (after Search-R1's
  normalisation: lower-case, drop punctuation, drop a/an/the, collapse spaces) against any gold
  answer, so 1.0 or 0.0; ``won`` = EM == 1.

``<think>...</think>`` reasoning is asked for by the prompt but not enforced (Search-R1 and
verl-agent do not enforce it either). A turn is invalid (verl-agent's rules) when the response
holds both a ``<search>`` and an ``<answer>`` tag, either tag twice, or no complete block; an empty
``<search></search>`` is invalid too. An invalid turn executes nothing, its observation is
Search-R1's fixed message (``INVALID_MESSAGE``), and the pipeline subtracts
``invalid_action_penalty`` (0.01). Tags match case-insensitively. The episode also ends after
``max_turns`` (4) turns; a search in the last turn is not executed (nothing could read it).

Criteria (judged when the episode ends, each with a static feedback string in ``FEEDBACK``):
``answered`` (an answer block within the turn budget), ``searched`` (at least one valid search
per hop of the question before answering), ``exact_match``, ``valid_actions`` (no invalid turn).
``info`` on the last step carries ``em``, ``f1`` (SQuAD token F1, for evaluation only),
``subem`` (a gold answer is a substring of the answer), the answer, the gold answers and counts.

A real episode (default options, split ``valid``, seed 81; responses written by hand)::

    task: Who founded the company that makes the Trougath?
    turn 0  <think>I need the maker of the Trougath.</think> <search> Trougath </search>
         -> <information>Doc 1(Title: "Trougath") The Trougath is a rice cooker made by Peathork
            Appliances. It was first sold in 2012 and is assembled in a factory in
            Stourzeax.</information>                                             reward 0
    turn 1  The Trougath is made by Peathork Appliances.     (no tags: invalid, penalty 0.01)
         -> My previous action is invalid. If I want to search, I should put the query between
            <search> and </search>. If I want to give the final answer, I should put the answer
            between <answer> and </answer>. Let me try again.
    turn 2  <think>Now the founder of Peathork Appliances.</think> <search> Peathork Appliances </search>
         -> <information>Doc 1(Title: "Peathork Appliances") Peathork Appliances is a kitchen
            appliances company headquartered in Beaspo. It was founded in 1987 by Priya Mirklai. It
            employs about 8,797 people and opened a second office in Stourzeax in 2000.
            Doc 2(Title: "Sonzand") The Sonzand is a blender made by Peathork Appliances. ...
            Doc 3(Title: "Trougath") The Trougath is a rice cooker made by ...</information>
    turn 3  <think>Priya Mirklai founded it.</think> <answer> Priya Mirklai </answer>
         -> "Episode finished."  reward 1.0, done, won; info em 1.0, f1 1.0, n_searches 2;
            criteria answered, searched, exact_match passed; valid_actions failed (failing_turn 1)

The prompt follows verl-agent's search template (``agent_system/environments/prompts/search.py``)
in our own words: the question, then (after the first turn) the earlier actions each followed by
its observation, then the instruction to think, then search or answer. Deviations from Search-R1
and verl-agent are listed in docs/envs_search_qa.md.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from dataclasses import dataclass

from envs.base import Observation, StepResult, TextEnv, criteria_from_verdicts, register_env
from envs.options import check_ints, known_options
from envs.search_qa.corpus import (
    SPLITS,
    Corpus,
    Question,
    file_questions,
    generated_corpus,
    normalize_answer,
    select_tasks,
    wiki_corpus,
    wiki_data_path,
)
from envs.search_qa.retriever import HTTPRetriever, Retriever, format_information
from pipeline.core.types import CriterionResult, Message

# Search-R1's reply to a turn without a usable action (llm_agent/generation.py), stripped.
INVALID_MESSAGE = (
    "My previous action is invalid. If I want to search, I should put the query between "
    "<search> and </search>. If I want to give the final answer, I should put the answer "
    "between <answer> and </answer>. Let me try again."
)
FINISHED = "Episode finished."

FEEDBACK = {
    "answered": "Finish within the turn budget: once the documents contain the answer, stop searching "
    "and write it inside <answer> and </answer>.",
    "searched": "Do not answer from memory: search for the entity the question names first, and when the "
    "question goes through another entity (the company that makes X, the founder of Y), "
    "search again for that entity before answering.",
    "exact_match": "Put only the answer itself inside the answer tags, a name, city or year copied exactly "
    "as the documents write it, with no explanation or extra words.",
    "valid_actions": "Every turn must contain exactly one action: either <search> query </search> or "
    "<answer> answer </answer>, never both and never twice; reason inside <think> </think> "
    "first.",
}
CRITERIA = tuple(FEEDBACK)

# What each generated question kind asks for, in the expert's reasoning (the last hop's entity).
ASKS = {
    "company_founder": "who founded {entity}",
    "product_founder": "who founded {entity}",
    "company_hq": "the city where {entity} is headquartered",
    "product_hq": "the city where {entity} is headquartered",
    "company_year": "the year {entity} was founded",
    "product_year": "the year {entity} was founded",
    "product_maker": "the company that makes the {entity}",
    "person_birthplace": "the city where {entity} was born",
    "founder_birthplace": "the city where {entity} was born",
    "product_founder_birthplace": "the city where {entity} was born",
}


# ----- scoring (Search-R1's qa_em, SQuAD F1) ------------------------------------------------------


def exact_match(prediction: str, golds: tuple[str, ...] | list[str] | str) -> float:
    golds = [golds] if isinstance(golds, str) else golds
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in golds))


def substring_match(prediction: str, golds: tuple[str, ...] | list[str] | str) -> float:
    """Search-R1's ``subem``: some normalised gold answer occurs inside the normalised prediction."""
    golds = [golds] if isinstance(golds, str) else golds
    pred = normalize_answer(prediction)
    return float(any(normalize_answer(g) in pred for g in golds))


def f1_score(prediction: str, golds: tuple[str, ...] | list[str] | str) -> float:
    """SQuAD token F1, best over the gold answers (evaluation only; never a reward here)."""
    golds = [golds] if isinstance(golds, str) else golds
    pred = normalize_answer(prediction).split()
    best = 0.0
    for gold in golds:
        ref = normalize_answer(gold).split()
        if not pred or not ref:
            best = max(best, float(pred == ref))
            continue
        same = sum((Counter(pred) & Counter(ref)).values())
        if same:
            precision, recall = same / len(pred), same / len(ref)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


# ----- parsing ---------------------------------------------------------------------------------------
_OPEN = {tag: re.compile(rf"<{tag}>", re.IGNORECASE) for tag in ("search", "answer")}
_BLOCK = {tag: re.compile(rf"<{tag}>(.*?)</{tag}>", re.IGNORECASE | re.DOTALL) for tag in ("search", "answer")}


@dataclass(frozen=True, slots=True)
class ParsedTurn:
    kind: str  # "search" | "answer" | "" (invalid)
    content: str  # the stripped query or answer
    reason: str = ""  # why the turn is invalid ("" when valid)

    @property
    def action(self) -> str:
        """The action as verl-agent's projection writes it: ``<search>q</search>`` / ``<answer>a</answer>``."""
        return f"<{self.kind}>{self.content}</{self.kind}>" if self.kind else ""


def parse_response(response: object) -> ParsedTurn:
    """One turn's action. Never raises: anything unusable is an invalid turn with a reason."""
    if not isinstance(response, str):
        return ParsedTurn("", "", f"response is a {type(response).__name__}, not text")
    counts = {tag: len(p.findall(response)) for tag, p in _OPEN.items()}
    if counts["search"] and counts["answer"]:
        return ParsedTurn("", "", "both <search> and <answer> tags")
    for tag, n in counts.items():
        if n > 1:
            return ParsedTurn("", "", f"<{tag}> appears {n} times")
    for tag in ("search", "answer"):
        m = _BLOCK[tag].search(response)
        if m:
            content = m.group(1).strip()
            if tag == "search" and not content:
                return ParsedTurn("", "", "empty search query")
            return ParsedTurn(tag, content)
    return ParsedTurn("", "", "no complete <search>...</search> or <answer>...</answer> block")


# ----- prompt (verl-agent's search template, in our words) -----------------------------------------
_INSTRUCTION = (
    "Now it's your turn to respond for the current step.\n"
    "First reason about what you know and what you still need; this reasoning MUST be enclosed within "
    "<think> </think> tags.\n"
    "Then take exactly one of the following actions (never both):\n"
    "(1) If some knowledge is missing, call the search engine with <search> your query </search>; "
    "it returns the top documents between <information> and </information>.\n"
    "(2) If you know enough to answer with confidence, give the final answer inside <answer> </answer> "
    "tags, without explanations. For example, <answer> Beijing </answer>."
)
TEMPLATE_NO_HISTORY = (
    "You are an expert agent who answers the given question step by step, using a search engine.\n"
    "Your question: {question}\n\n" + _INSTRUCTION
)
TEMPLATE_LATEST = (
    "You are an expert agent who answers the given question step by step, using a search engine.\n"
    "Your question: {question}\n\n"
    "You have already taken {step_count} step(s). The result of your latest step:\n{observation}\n\n" + _INSTRUCTION
)
TEMPLATE = (
    "You are an expert agent who answers the given question step by step, using a search engine.\n"
    "Your question: {question}\n\n"
    "You have already taken {step_count} step(s). Below are your most recent steps: each of your actions "
    "(your queries wrapped in <search> </search>) followed by what came back (the search engine's "
    "results wrapped in <information> </information>). History:\n{history}\n\n" + _INSTRUCTION
)


def render_history(history: list[tuple[str, str]], observation: Observation, history_length: int) -> str:
    """The last ``history_length`` actions, each followed by the observation it produced."""
    after = [obs for obs, _ in history[1:]] + [observation.text]  # the observation after each action
    pairs = list(zip([act for _, act in history], after))[-history_length:]
    return "\n\n".join(f"{act.strip()}\n{obs.strip()}" for act, obs in pairs)


# ----- options ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SearchQAOptions:
    """``env.options`` for ``search_qa``."""

    corpus: str = "generated"  # generated | wiki | file (your JSONL questions; needs retriever=http)
    retriever: str = "bm25"  # bm25 (in-process, over the corpus) | http (a Search-R1 /retrieve server)
    url: str = ""  # http: the endpoint, e.g. http://127.0.0.1:8000/retrieve
    timeout_s: float = 30.0  # http: seconds per request (> 0); 2 retries on connection errors and 5xx
    topk: int = 3  # documents per search, 1..20 (Search-R1: 3)
    max_turns: int = 4  # turns per episode, >= 1 (Search-R1 and verl-agent: 4)
    n_tasks: int = 0  # tasks per split (seed % n_tasks); 0 = every question of the split
    hops: tuple[int, ...] = (1, 2)  # hop counts to draw, taking turns (1-3; wiki has only 1)
    corpus_seed: int = 0  # generated: which synthetic world (also shuffles every corpus's task order)
    n_companies: int = 200  # generated: world size, 10..5000 companies (4 documents each)
    questions_path: str = ""  # file: JSONL with question + golden_answers; "{split}" = one file per split

    @classmethod
    def from_dict(cls, options: dict | None) -> "SearchQAOptions":
        opts = cls(**known_options(options, cls, "search_qa", tuples=("hops",)))
        opts.validate()
        return opts

    def validate(self) -> None:
        if self.corpus not in ("generated", "wiki", "file"):
            raise ValueError(f"search_qa corpus must be generated, wiki or file, got {self.corpus!r}")
        if self.retriever not in ("bm25", "http"):
            raise ValueError(f"search_qa retriever must be bm25 or http, got {self.retriever!r}")
        if self.retriever == "http" and not self.url:
            raise ValueError(
                "search_qa retriever=http needs url (the Search-R1 /retrieve endpoint, "
                "e.g. http://127.0.0.1:8000/retrieve)"
            )
        if self.corpus == "file" and (self.retriever != "http" or not self.questions_path):
            raise ValueError(
                "search_qa corpus=file has questions but no documents: it needs "
                "questions_path and retriever=http (your retrieval server holds the documents)"
            )
        if self.corpus != "file" and self.questions_path:
            raise ValueError("search_qa questions_path is only read with corpus=file")
        check_ints("search_qa", self, ("topk", "max_turns", "n_tasks", "corpus_seed", "n_companies"))
        if not 1 <= self.topk <= 20:
            raise ValueError(f"search_qa topk must be in 1..20, got {self.topk}")
        if self.max_turns < 1:
            raise ValueError(f"search_qa max_turns must be >= 1, got {self.max_turns}")
        if self.n_tasks < 0:
            raise ValueError(f"search_qa n_tasks must be >= 0 (0 = the whole split), got {self.n_tasks}")
        if not 10 <= self.n_companies <= 5000:
            raise ValueError(f"search_qa n_companies must be in 10..5000, got {self.n_companies}")
        if (
            not self.hops
            or len(set(self.hops)) != len(self.hops)
            or any(not isinstance(h, int) or isinstance(h, bool) or h not in (1, 2, 3) for h in self.hops)
        ):
            raise ValueError(f"search_qa hops must be distinct values among 1, 2, 3, got {list(self.hops)}")
        if not isinstance(self.timeout_s, (int, float)) or self.timeout_s <= 0:
            raise ValueError(f"search_qa timeout_s must be > 0, got {self.timeout_s!r}")


def corpus_for(opts: SearchQAOptions) -> Corpus | None:
    if opts.corpus == "generated":
        return generated_corpus(opts.corpus_seed, opts.n_companies)
    if opts.corpus == "wiki":
        return wiki_corpus()
    return None


def tasks_for(opts: SearchQAOptions, split: str) -> list[Question]:
    """The split's task list (cached per options and split)."""
    if split not in SPLITS:
        raise ValueError(f"unknown search_qa split {split!r}; choose one of {list(SPLITS)}")
    key = (opts.corpus, opts.corpus_seed, opts.n_companies, opts.questions_path, split, opts.hops, opts.n_tasks)
    with _TASKS_LOCK:
        tasks = _TASKS.get(key)
    if tasks is None:
        corpus = corpus_for(opts)
        questions = corpus.questions if corpus is not None else file_questions(opts.questions_path, split)
        tasks = select_tasks(questions, split, opts.hops, opts.n_tasks, seed=opts.corpus_seed)
        if not tasks:
            raise ValueError(f"search_qa: no {opts.corpus} questions with hops {list(opts.hops)} in split {split!r}")
        if opts.n_tasks and len(tasks) < opts.n_tasks:
            raise ValueError(
                f"search_qa: split {split!r} has only {len(tasks)} {opts.corpus} questions with hops "
                f"{list(opts.hops)}, fewer than n_tasks={opts.n_tasks}; lower n_tasks (0 = all)"
            )
        with _TASKS_LOCK:
            _TASKS[key] = tasks
    return tasks


_TASKS: dict[tuple, list[Question]] = {}
_TASKS_LOCK = threading.Lock()


def make_retriever(opts: SearchQAOptions) -> Retriever:
    if opts.retriever == "http":
        return HTTPRetriever(opts.url, timeout_s=opts.timeout_s)
    corpus = corpus_for(opts)
    assert corpus is not None  # validate() rules out bm25 without documents
    return corpus.bm25()


# ----- the env ---------------------------------------------------------------------------------------
@register_env("search_qa")
class SearchQAEnv(TextEnv):
    max_turns = 4
    invalid_action_penalty = 0.01
    success_reward = 1.0

    def __init__(self, opts: SearchQAOptions, split: str, tasks: list[Question], retriever: Retriever):
        self.opts, self.split = opts, split
        self.max_turns = opts.max_turns
        self._tasks, self._retriever = tasks, retriever
        self._q: Question | None = None
        self._turn = 0
        self._searches = 0
        self._invalid_turns: list[int] = []
        self._answer: str | None = None
        self._answer_turn: int | None = None
        self._done = False

    # ----- construction --------------------------------------------------------------------------
    @classmethod
    def from_options(cls, options: dict, split: str) -> "SearchQAEnv":
        opts = SearchQAOptions.from_dict(options)
        tasks = tasks_for(opts, split)
        return cls(opts, split, tasks, make_retriever(opts))

    @classmethod
    def validate_options(cls, options: dict) -> None:
        """Cheap launch check: option values, the wiki package, the questions file(s)."""
        opts = SearchQAOptions.from_dict(options)
        if opts.corpus == "wiki":
            wiki_data_path()
        if opts.corpus == "file":
            for split in SPLITS if "{split}" in opts.questions_path else ("train",):
                file_questions(opts.questions_path, split)

    # ----- episode -------------------------------------------------------------------------------
    def reset(self, seed: int) -> Observation:
        self._q = self._tasks[int(seed) % len(self._tasks)]
        self.task_text, self.task_type = self._q.question, self._q.task_type
        corpus = (
            self.opts.corpus
            if self.opts.corpus != "generated"
            else f"generated-s{self.opts.corpus_seed}-n{self.opts.n_companies}"
        )
        self.task_id = f"search_qa/{corpus}/{self.split}/{self._q.qid}"
        self._turn, self._searches, self._invalid_turns = 0, 0, []
        self._answer, self._answer_turn, self._done = None, None, False
        return Observation(text=self._q.question)

    def step(self, response: str) -> StepResult:
        self.check_step(started=self._q is not None, done=self._done)
        turn = self._turn
        self._turn += 1
        last = self._turn >= self.max_turns
        parsed = parse_response(response)
        info: dict = {
            "turn": self._turn,
            "task_id": self.task_id,
            "action_type": parsed.kind or "invalid",
            "invalid_reason": parsed.reason,
        }
        reward, text = 0.0, FINISHED
        if not parsed.kind:
            self._invalid_turns.append(turn)
            text = INVALID_MESSAGE
        elif parsed.kind == "answer":
            self._answer, self._answer_turn = parsed.content, turn
            reward = self.success_reward * exact_match(parsed.content, self._q.answers)
        else:
            self._searches += 1
            info["query"] = parsed.content
            if not last:  # a search in the last turn is not run: no turn is left to read it
                hits = self._retriever.retrieve([parsed.content], topk=self.opts.topk)[0]
                info["retrieved"] = [h["document"]["id"] for h in hits]
                text = f"<information>{format_information(hits).strip()}</information>"
        self._done = parsed.kind == "answer" or last
        criteria: list[CriterionResult] = []
        if self._done:
            text = FINISHED
            criteria = self._judge()
            info.update(self._scores())
        return StepResult(
            observation=Observation(text=text),
            reward=reward,
            done=self._done,
            won=self._done and reward >= self.success_reward,
            action_valid=not parsed.reason,
            action=parsed.action,
            criteria=criteria,
            info=info,
        )

    def _scores(self) -> dict:
        q, answer = self._q, self._answer
        given = answer is not None
        return {
            "answer": answer,
            "golds": list(q.answers),
            "em": exact_match(answer, q.answers) if given else 0.0,
            "f1": f1_score(answer, q.answers) if given else 0.0,
            "subem": substring_match(answer, q.answers) if given else 0.0,
            "n_searches": self._searches,
            "n_invalid": len(self._invalid_turns),
            "hops": q.hops,
            "kind": q.kind,
        }

    def _judge(self) -> list[CriterionResult]:
        q, last_turn = self._q, self._turn - 1
        answered = self._answer is not None
        em = answered and exact_match(self._answer, q.answers) == 1.0
        verdicts = {
            "answered": (answered, last_turn),
            # Answering too early fails at the answer turn; never searching enough, at the first turn.
            "searched": (self._searches >= q.hops, self._answer_turn if answered else 0),
            "exact_match": (em, self._answer_turn if answered else last_turn),
            "valid_actions": (not self._invalid_turns, self._invalid_turns[0] if self._invalid_turns else None),
        }
        return criteria_from_verdicts(verdicts, FEEDBACK)

    # ----- task metadata -------------------------------------------------------------------------
    @property
    def question(self) -> Question | None:
        """The current question with its gold answers, hop count and an expert's queries."""
        return self._q

    def privileged_hint(self) -> str | None:
        """What a teacher may know (the ``hints`` context kind): the expert's queries, one per hop,
        and the gold answer, e.g. ``Search for: Kelvar Labs. The answer is Oslo.``"""
        if self._q is None:
            return None
        queries = [q for q in self._q.queries if q]
        searches = f"Search for: {', then '.join(queries)}. " if queries else ""
        return f"{searches}The answer is {self._q.answers[0]}."

    def expert_response(self) -> str:
        """The next response of a scripted expert: one search per hop (the entity's name), then the gold answer.

        Its reasoning says what the question asks for and quotes the document sentence that
        carries the next entity or the answer, so a clone learns to read the right fact (a year
        and a founder share one sentence) rather than to guess the answer's kind. Only meaningful
        for corpora that record queries (generated, wiki); with ``file`` questions the expert
        answers at once.
        """
        if self._q is None:
            raise RuntimeError("SearchQAEnv.expert_response() before reset()")
        q = self._q
        queries = [qq for qq in q.queries if qq]
        hop = self._searches
        if hop < len(queries):
            query = queries[hop]
            found = self._support_sentence(hop - 1, query) if hop else ""
            said = f"The document says: {found} " if found else ""
            return f"<think>{said}I need to look up {query}.</think>\n<search> {query} </search>"
        asked = ASKS.get(q.kind, "").format(entity=queries[-1] if queries else "")
        found = self._support_sentence(len(queries) - 1, q.answers[0]) if queries else ""
        think = " ".join(
            x
            for x in (
                f"The question asks for {asked}." if asked else "",
                f"The document says: {found}" if found else "",
            )
            if x
        )
        return f"<think>{think or 'The documents give the answer.'}</think>\n<answer> {q.answers[0]} </answer>"

    def hinted_expert_response(self) -> str:
        """Told the gold answer (``privileged_hint``), the expert answers at once."""
        if self._q is None:
            raise RuntimeError("SearchQAEnv.hinted_expert_response() before reset()")
        answer = self._q.answers[0]
        return f"<think>The hint gives the answer: {answer}.</think>\n<answer> {answer} </answer>"

    def _support_sentence(self, hop: int, needle: str) -> str:
        """The sentence of hop ``hop``'s supporting document that names ``needle`` ("" if unknown)."""
        corpus = corpus_for(self.opts)
        doc = corpus.by_id.get(self._q.support[hop]) if corpus is not None and 0 <= hop < len(self._q.support) else None
        if doc is None:
            return ""
        for sentence in re.split(r"(?<=\.)\s+", doc.text):
            if needle.lower() in sentence.lower():
                return sentence
        return ""

    def build_messages(
        self, history: list[tuple[str, str]], observation: Observation, history_length: int
    ) -> list[Message]:
        question = self.task_text or (history[0][0] if history else observation.text)
        if not history:
            text = TEMPLATE_NO_HISTORY.format(question=question)
        elif history_length <= 0:
            text = TEMPLATE_LATEST.format(question=question, step_count=len(history), observation=observation.text)
        else:
            text = TEMPLATE.format(
                question=question, step_count=len(history), history=render_history(history, observation, history_length)
            )
        return [Message(role="user", content=text)]
