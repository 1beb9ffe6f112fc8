"""Privileged context providers: the skills provider's UCB statistics learn from the student's own
episodes (a view carries a snapshot to the worker, the worker records what it offered, the driver
updates), round-trip through a checkpoint, and the feedback provider's views."""

from __future__ import annotations

from envs import make_env
from pipeline.context.providers import FeedbackContext, SkillsContext, turn_feedback
from pipeline.core.types import CriterionResult, Episode, EpisodeGroup, Message


def skills(mode="ucb", top_k=2) -> SkillsContext:
    return SkillsContext(
        SkillsContext.Options(skill_bank="keyword", skill_mode=mode, skill_top_k=top_k, placement="user"),
        env_name="keyword",
    )


def played(view, seed: int, reward: float) -> Episode:
    """What a rollout worker does with a view: apply it to the prompt, record the offered ids."""
    env = make_env("keyword", {}, "train")
    obs = env.reset(seed)
    prompt, offered = view.apply([Message(role="user", content=obs.text)], env, 0, None)
    assert "[Privileged Skill Information]" in prompt.messages[-1].content
    return Episode(
        task_id="t",
        env_name="keyword",
        seed=seed,
        task_type=env.task_type,
        task_text=env.task_text,
        reward=reward,
        context_ids=offered,
    )


def test_ucb_learns_from_the_students_own_episodes_and_resumes_exactly():
    provider = skills()
    first = played(provider.student_view(), 1, reward=1.0)
    assert len(first.context_ids) == 2
    provider.observe([EpisodeGroup(task_id="t", seed=1, episodes=[first])])
    # the next view carries the updated statistics: the offered skills are no longer unvisited
    second = played(provider.student_view(), 2, reward=0.0)
    assert set(second.context_ids).isdisjoint(first.context_ids)  # unvisited skills come first
    provider.observe([EpisodeGroup(task_id="t", seed=2, episodes=[second])])
    state = provider.state_dict()
    assert state["ucb"]["keyword"]["episodes"] == 2
    resumed = skills()
    resumed.load_state_dict(state)
    assert resumed.retriever.ucb_scores("keyword") == provider.retriever.ucb_scores("keyword")
    assert played(resumed.student_view(), 3, 0.0).context_ids == played(provider.student_view(), 3, 0.0).context_ids


def test_non_ucb_modes_do_not_accumulate_statistics():
    provider = skills(mode="keyword")
    ep = played(provider.student_view(), 1, reward=1.0)
    provider.observe([EpisodeGroup(task_id="t", seed=1, episodes=[ep])])
    assert provider.state_dict() == {"ucb": {}}


def test_feedback_view_puts_the_first_attempts_feedback_before_the_failing_turn():
    ep = Episode(
        task_id="t",
        env_name="x",
        seed=0,
        criteria=[
            CriterionResult(criterion="a", passed=False, failing_turn=1, feedback="fix a"),
            CriterionResult(criterion="b", passed=True, feedback="never shown"),
        ],
    )
    view = FeedbackContext(FeedbackContext.Options(), env_name="x").student_view(ep)
    msgs = [Message(role="user", content="obs")]
    assert view.apply(msgs, None, 0, None)[0].messages == msgs  # before the failing turn: nothing
    assert "fix a" in view.apply(msgs, None, 1, None)[0].messages[-1].content
    assert FeedbackContext(FeedbackContext.Options(), env_name="x").student_view(None) is None
    assert turn_feedback(ep, 1) == ["fix a"]
