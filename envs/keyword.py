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

Splits are disjoint on the word, the unit that carries the answer: the 900 words of
``envs/data/keyword_words.txt`` go to ``train`` / ``valid`` / ``test`` by a stable hash of the word
(80/10/10: 729 / 95 / 76 words), so a held-out task never asks for a word seen in training (nor in
the warm start's clone). Within a split, task ``seed`` asks for word ``seed % n`` of the split's
list in a fixed shuffled order, ``n`` = ``n_tasks`` or, with ``n_tasks: 0``, every word of the
split: so a split has exactly ``n`` distinct tasks.

Example episode (seed 3)::

    user: Reply with the word "river" and nothing else, written as <answer>river</answer>.
    assistant: Sure! <answer>river</answer>
    -> reward 1.0, won True, criteria format/keyword/brevity all passed
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
from dataclasses import dataclass
from pathlib import Path

from envs.base import Observation, StepResult, TextEnv, criteria_from_verdicts, register_env
from envs.options import known_options
from pipeline.core.types import CriterionResult, Message

WORDS_FILE = Path(__file__).parent / "data" / "keyword_words.txt"
SPLITS = ("train", "valid", "test")


@functools.cache
def all_words() -> tuple[str, ...]:
    """Every word of the task, sorted (``envs/data/keyword_words.txt``)."""
    lines = WORDS_FILE.read_text().splitlines()
    return tuple(sorted({w.strip() for w in lines if w.strip() and not w.startswith("#")}))


def split_of(word: str) -> str:
    """``train`` / ``valid`` / ``test`` (80/10/10) from a stable hash of the word."""
    bucket = int(hashlib.sha256(f"keyword/{word}".encode()).hexdigest(), 16) % 10
    return "test" if bucket == 0 else "valid" if bucket == 1 else "train"


@functools.cache
def split_words(split: str) -> tuple[str, ...]:
    """The words of ``split`` in a fixed order (shuffled once, so task 0..k-1 is no alphabet run)."""
    if split not in SPLITS:
        raise ValueError(f"keyword: unknown split {split!r}; choose one of {list(SPLITS)}")
    words = [w for w in all_words() if split_of(w) == split]
    random.Random(f"keyword/order/{split}").shuffle(words)
    return tuple(words)


FEEDBACK = {
    "keyword": "Your reply must contain the requested word itself.",
    "format": "Put exactly the requested word inside a single <answer>...</answer> block.",
    "brevity": "Keep the whole reply very short: no explanation, just the answer block.",
}

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass
class KeywordOptions:
    max_words: int = 8  # brevity criterion: at most this many words in the whole reply
    n_tasks: int = 0  # distinct tasks (words) per split; 0 = every word of the split (729/95/76)
    hint_format: bool = True  # show the <answer> format in the instruction

    def validate(self) -> None:
        if self.max_words < 1:
            raise ValueError(f"keyword: max_words={self.max_words} must be >= 1")
        smallest = min(len(split_words(s)) for s in SPLITS)
        if not 0 <= self.n_tasks <= smallest:
            raise ValueError(
                f"keyword: n_tasks={self.n_tasks} must be 0 (every word of the split) or between 1 "
                f"and {smallest}, the words of the smallest split"
            )

    def n_tasks_for(self, split: str) -> int:
        return self.n_tasks or len(split_words(split))


@register_env("keyword")
class KeywordEnv(TextEnv):
    thread_safe = True  # pure Python, no shared state
    max_turns = 1
    invalid_action_penalty = 0.0  # the rubric already scores malformed replies
    success_reward = 1.0
    task_type = "keyword"

    def __init__(self, opts: KeywordOptions, split: str):
        split_words(split)  # an unknown split fails here, naming the splits
        self.opts = opts
        self.split = split
        self._ask("")
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
        self._seed = seed
        self._ask(split_words(self.split)[seed % self.opts.n_tasks_for(self.split)])
        return Observation(text=self.task_text)

    def _ask(self, word: str) -> None:
        self._word = word
        hint = f", written as <answer>{word}</answer>" if self.opts.hint_format else ""
        self.task_text = f'Reply with the word "{word}" and nothing else{hint}.'
        self.task_id = f"keyword-{self.split}-{word}"

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
        # One turn: a criterion that fails, fails at turn 0.
        return criteria_from_verdicts({"keyword": (mentions, 0), "format": (fmt, 0), "brevity": (brief, 0)}, FEEDBACK)

    def step(self, response: str) -> StepResult:
        criteria = self.judge(response)
        passed = sum(c.passed for c in criteria)
        won = passed == len(criteria)
        blocks = _ANSWER.findall(response)
        return StepResult(
            observation=Observation(text="Episode finished."),
            reward=self.success_reward * passed / len(criteria),
            done=True,
            won=won,
            action_valid=True,
            action=blocks[0].strip() if blocks else "",
            criteria=criteria,
        )
