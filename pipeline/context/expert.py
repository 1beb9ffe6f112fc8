"""The env's expert playing one task through the rollout's own prompts: the rows of the warm
start's behaviour cloning (``pipeline.orchestration.warm_start``) and of the equal-information
baseline's hinted demonstrations (``actors.rollout``). It lives in the context layer because both
of those layers use it and neither may import the other."""

from __future__ import annotations

from pipeline.core.types import TurnRecord


def expert_episode(
    env,
    prompts,
    seed: int,
    max_turns: int | None = None,
    *,
    hinted_reply: bool = False,
    hint_prompt=None,
    version: int = 0,
) -> tuple[list[TurnRecord], bool] | None:
    """The env's expert plays task ``seed`` of ``env`` (a fresh env of the wanted split); returns
    its turns as rows and whether it won, or None when ``hinted_reply`` and the task has no hint.

    ``hinted_reply``: the expert that knows ``privileged_hint()`` answers
    (``TextEnv.hinted_expert_response``). ``hint_prompt`` = (teacher prompts, placement): the hint
    is also in every prompt, where a ``hints`` teacher puts it (the warm start's hinted rows);
    None: the prompt is the student's own (the equal-information baseline's demonstrations).
    Rows carry behaviour log-probs 0 and policy version ``version``: no policy sampled them."""
    from pipeline.context.placement import with_privileged
    from pipeline.context.student_prompts import ContextFull

    obs, history, rows, res = env.reset(seed), [], [], None
    hint = env.privileged_hint() if hinted_reply else None
    if hinted_reply and not hint:
        return None
    for turn in range(max_turns or env.max_turns):
        text = env.hinted_expert_response() if hint else env.expert_response()
        if text is None:  # the expert has nothing more to do (check_launch refuses envs without one)
            break
        try:
            messages, ids, truncated, _ = prompts.build(env, history, obs, turn, last=rows[-1] if rows else None)
        except ContextFull:  # env.prompt_format=chat: the conversation no longer fits; not won
            res = None
            break
        res = env.step(text)
        if not res.action_valid:
            raise RuntimeError(
                f"{env.__class__.__name__} task {seed} turn {turn}: the expert's response "
                f"{text!r} is invalid ({res.info.get('invalid_reason')})"
            )
        row = TurnRecord(
            prompt_ids=ids,
            response_ids=[],
            behaviour_logprobs=[],
            policy_version=version,
            turn_index=turn,
            messages=messages,
            response_text=text,
            action=res.action,
            truncated_prompt=truncated,
            step_reward=res.reward,
        )
        if hint_prompt is not None and not (prompts.chat and turn):  # a conversation holds it from turn 0
            teacher, placement = hint_prompt
            row.prompt_ids = teacher.skills_ids(row, hint, placement)
            row.messages = with_privileged(messages, hint, placement, prompts.default_system).messages
        row.response_ids = prompts.response_ids(row.messages, text)
        row.behaviour_logprobs = [0.0] * len(row.response_ids)
        rows.append(row)
        history.append((obs.text, res.action))
        obs = res.observation
        if res.done:
            break
    return rows, bool(res is not None and res.won)
