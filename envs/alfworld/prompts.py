"""verl-agent's ALFWorld prompt, rewritten here (``agent_system/environments/prompts/alfworld.py``).

First turn (or ``history_length == 0``): the current observation (which carries the task) and
the admissible actions. Later turns: the task, how many steps were taken, the last
``history_length`` (observation, action) pairs formatted as verl-agent's ``SimpleMemory`` does
(``[Observation 3: '...', Action 3: '...']``, numbered from the episode start), the current
observation and the admissible actions. ``help`` is left out of the list, as in verl-agent.
Fixed relative to verl-agent: its typo "observaitons" reads "observations" here.

Example: the prompt of step 2 of a real episode (``history_length=2``; the first observation
is shortened here)::

    <blank line>
    You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: look at watch under the floorlamp.
    Prior to this step, you have already taken 1 step(s). Below are the most recent 1 observations and the corresponding actions you took: [Observation 1: '-= Welcome to TextWorld, ALFRED! =-

    You are in the middle of a room. Looking quickly around you, you see a coffeetable 1, ..., and a sofa 1.

    Your task is to: look at watch under the floorlamp.', Action 1: 'go to shelf 3']
    You are now at step 2 and your current observation is: You arrive at shelf 3. On the shelf 3, you see a watch 2.
    Your admissible actions of the current situation are: ['examine shelf 3'
     'go to coffeetable 1'
     ...
     'take watch 2 from shelf 3'].

    Now it's your turn to take an action.
    You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed within <think> </think> tags.
    Once you've finished your reasoning, you should choose an admissible action for current step and present it within <action> </action> tags.
"""

from __future__ import annotations

from pipeline.core.types import Message

_INSTRUCTION = (
    "Now it's your turn to take an action.\n"
    "You should first reason step-by-step about the current situation. "
    "This reasoning process MUST be enclosed within <think> </think> tags. \n"
    "Once you've finished your reasoning, you should choose an admissible action for current step "
    "and present it within <action> </action> tags.\n"
)

ALFWORLD_TEMPLATE_NO_HIS = (
    "\nYou are an expert agent operating in the ALFRED Embodied Environment.\n"
    "Your current observation is: {current_observation}\n"
    "Your admissible actions of the current situation are: [{admissible_actions}].\n\n" + _INSTRUCTION
)

ALFWORLD_TEMPLATE = (
    "\nYou are an expert agent operating in the ALFRED Embodied Environment. "
    "Your task is to: {task_description}\n"
    "Prior to this step, you have already taken {step_count} step(s). "
    "Below are the most recent {history_length} observations and the corresponding actions you took: "
    "{action_history}\n"
    "You are now at step {current_step} and your current observation is: {current_observation}\n"
    "Your admissible actions of the current situation are: [{admissible_actions}].\n\n" + _INSTRUCTION
)

_TASK_PREFIX = "Your task is to: "


def extract_task(observation: str) -> str:
    """The task sentence after ``Your task is to: `` ("" if absent), as verl-agent extracts it."""
    start = observation.find(_TASK_PREFIX)
    return observation[start + len(_TASK_PREFIX) :].strip() if start >= 0 else ""


def format_admissible(actions: list[str]) -> str:
    return "\n ".join(f"'{a}'" for a in actions if a != "help")


def format_history(history: list[tuple[str, str]], history_length: int) -> tuple[str, int]:
    """verl-agent's memory lines for the last ``history_length`` pairs, and how many were shown."""
    recent = history[-history_length:] if history_length > 0 else []
    first = len(history) - len(recent) + 1
    lines = [f"[Observation {first + i}: '{obs}', Action {first + i}: '{act}']" for i, (obs, act) in enumerate(recent)]
    return "\n".join(lines), len(recent)


def build_messages(
    history: list[tuple[str, str]], observation, history_length: int, task_text: str | None = None
) -> list[Message]:
    """The user message for the next turn.

    ``history`` holds the (observation, action) pairs of earlier turns, ``observation`` is an
    ``envs.base.Observation``. ``task_text`` defaults to the task found in the first observation.
    """
    admissible = format_admissible(observation.admissible_actions)
    if not history or history_length <= 0:
        text = ALFWORLD_TEMPLATE_NO_HIS.format(current_observation=observation.text, admissible_actions=admissible)
    else:
        if task_text is None:
            task_text = extract_task(history[0][0])
        action_history, shown = format_history(history, history_length)
        text = ALFWORLD_TEMPLATE.format(
            task_description=task_text,
            step_count=len(history),
            history_length=shown,
            action_history=action_history,
            current_step=len(history) + 1,
            current_observation=observation.text,
            admissible_actions=admissible,
        )
    return [Message(role="user", content=text)]
