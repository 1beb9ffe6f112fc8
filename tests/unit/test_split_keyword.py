"""keyword: held-out splits are disjoint from train on the word, the unit that carries the answer."""

import pytest

from envs import make_env
from envs.keyword import all_words, split_words


def words_of(split: str, n_seeds: int = 5000, seed0: int = 0) -> set[str]:
    env = make_env("keyword", {"hint_format": False}, split=split)
    out = set()
    for seed in range(seed0, seed0 + n_seeds):
        env.reset(seed)
        out.add(env._word)
    return out


def test_held_out_words_never_occur_in_train_as_sets():
    # training seeds are large random ints (controller.task_seed): sample them the same way
    train = words_of("train", 5000) | words_of("train", 5000, seed0=2**31 - 5000)
    valid, test = words_of("valid"), words_of("test")
    assert not valid & train and not test & train
    assert not valid & test and valid != test
    assert train | valid | test == set(all_words())


def test_n_tasks_tells_the_truth():
    for split, n in (("train", 729), ("valid", 95), ("test", 76)):
        assert len(split_words(split)) == n and len(words_of(split, 3 * n)) == n
    env = make_env("keyword", {"n_tasks": 10}, split="valid")
    seen = set()
    for seed in range(1000):
        env.reset(seed)
        seen.add(env._word)
    assert len(seen) == 10


def test_the_64_validation_tasks_are_64_distinct_held_out_words():
    env = make_env("keyword", {}, split="valid")
    words = []
    for seed in range(64):  # the controller's validation tasks are seeds 0..val_tasks-1
        env.reset(seed)
        words.append(env._word)
    assert len(set(words)) == 64


def test_bad_n_tasks_and_unknown_split_are_clear_errors():
    with pytest.raises(ValueError, match="n_tasks=500"):
        make_env("keyword", {"n_tasks": 500}, split="train")
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        make_env("keyword", {}, split="dev")
