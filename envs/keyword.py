"""``keyword``: a one-turn instruction-following task with a graded rubric (fast, CPU-learnable).

The agent is asked to answer with one given word inside ``<answer>...</answer>``. Three criteria
are judged, each with a static feedback string (the privileged context of targeted guidance):

* ``keyword``: the reply mentions the requested word (case-insensitive, as a whole word);
* ``format``: exactly one ``<answer>...</answer>`` block, holding exactly the word (surrounding
  punctuation ignored);
* ``brevity``: the reply has between 1 and ``max_words`` words (an empty reply is not brief, it
  is no answer: without that floor GRPO learns to emit EOS at once).

Reward = ``success_reward`` x (fraction of criteria passed); ``won`` when all pass. SmolLM2-135M
passes some criteria some of the time out of the box, so reward has room to rise within a few dozen
GRPO steps: the environment of the learning test and of ``make smoke``.

Example episode (seed 3)::

    user: Reply with the word "river" and nothing else, written as <answer>river</answer>.
    assistant: Sure! <answer>river</answer>
    -> reward 1.0, won True, criteria format/keyword/brevity all passed
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

from envs.base import Observation, StepResult, TextEnv, known_options, register_env
from pipeline.core.types import CriterionResult, Message

WORDS = ("river", "apple", "stone", "cloud", "green", "table", "light", "music", "house", "tiger",
         "bread", "ocean", "paper", "horse", "chair", "dream", "glass", "plant", "sugar", "train")

FEEDBACK = {
    "keyword": "Your reply must contain the requested word itself.",
    "format": "Put exactly the requested word inside a single <answer>...</answer> block.",
    "brevity": "Keep the whole reply very short: no explanation, just the answer block.",
}

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass
class KeywordOptions:
    max_words: int = 8  # brevity criterion: at most this many words in the whole reply
    n_tasks: int = 1000  # distinct tasks per split
    hint_format: bool = True  # show the <answer> format in the instruction

    def validate(self) -> None:
        if self.max_words < 1 or self.n_tasks < 1:
            raise ValueError("keyword: max_words and n_tasks must be >= 1")


@register_env("keyword")
class KeywordEnv(TextEnv):
    thread_safe = True  # pure Python, no shared state
    max_turns = 1
    invalid_action_penalty = 0.0  # the rubric already scores malformed replies
    success_reward = 1.0

    def __init__(self, opts: KeywordOptions, split: str):
        self.opts = opts
        self.split = split
        self._word = ""
        self._seed = 0

    @classmethod
    def from_options(cls, options: dict, split: str) -> KeywordEnv:
        opts = KeywordOptions(**known_options(options, KeywordOptions, "keyword"))
        opts.validate()
        return cls(opts, split)

    @classmethod
    def validate_options(cls, options: dict) -> None:
        cls.from_options(options, split="train")

    def reset(self, seed: int) -> Observation:
        # The split shifts the task stream so train and validation tasks differ.
        offset = {"train": 0}.get(self.split, 7_919)
        rng = random.Random((seed % self.opts.n_tasks) + offset)
        self._seed = seed
        self._word = rng.choice(WORDS)
        return Observation(text=self.task_text)

    @property
    def task_text(self) -> str:
        hint = f", written as <answer>{self._word}</answer>" if self.opts.hint_format else ""
        return f'Reply with the word "{self._word}" and nothing else{hint}.'

    @property
    def task_type(self) -> str:
        return "keyword"

    @property
    def task_id(self) -> str:
        return f"keyword-{self.split}-{self._word}"

    def expert_response(self) -> str:
        """The answer block alone: all three criteria (the warm start clones it; with
        ``hint_format=false`` the instruction no longer shows the block, so only a clone knows it)."""
        return f"<answer>{self._word}</answer>"

    def privileged_hint(self) -> str | None:
        """The graded form of the answer (what ``hint_format=false`` hides from the student)."""
        return f"The reply graded correct is exactly: <answer>{self._word}</answer>" if self._word else None

    def build_messages(self, history, observation, history_length) -> list[Message]:
        return [Message(role="user", content=observation.text)]

    def judge(self, response: str) -> list[CriterionResult]:
        blocks = _ANSWER.findall(response)
        mentions = re.search(rf"\b{self._word}\b", response, re.IGNORECASE) is not None
        fmt = len(blocks) == 1 and blocks[0].strip().strip(".!?,;:'\"").lower() == self._word
        brief = 1 <= len(response.split()) <= self.opts.max_words
        verdicts = {"keyword": mentions, "format": fmt, "brevity": brief}
        # The feedback string is the criterion's static text; failing_turn marks where it failed.
        return [CriterionResult(criterion=c, passed=ok, failing_turn=None if ok else 0,
                                feedback=FEEDBACK[c]) for c, ok in verdicts.items()]

    def step(self, response: str) -> StepResult:
        criteria = self.judge(response)
        passed = sum(c.passed for c in criteria)
        won = passed == len(criteria)
        blocks = _ANSWER.findall(response)
        return StepResult(observation=Observation(text="Episode finished."),
                          reward=self.success_reward * passed / len(criteria), done=True, won=won,
                          action_valid=True, action=blocks[0].strip() if blocks else "",
                          criteria=criteria)
