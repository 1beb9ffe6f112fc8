"""Every method whose teacher (or demonstrator) is told the env's privileged hint keeps the hint out
of the student's own prompts, in training and in validation: the real RolloutWorker and HF engine
(tiny model) play the keyword task (its hint is the graded answer block, which the instruction
hides) exactly as the controller asks them to (``method.student_view()``, and the hinted expert's
demonstrations where the method wants them); every prompt the engine was given and every row's
prompt is read back. The controller's side (the same view for training and plain validation; a
hint only in the privileged replay) is tests/unit/test_controller_with_fake_workers.py."""

from __future__ import annotations

import pytest
from scripted_envs import rollout_worker

from envs import make_env
from pipeline.methods import available_methods, build_method, load_preset

pytestmark = pytest.mark.integration


def hint_methods() -> list[str]:
    """The presets whose teacher reads hints, and the control that imitates the hinted expert."""
    out = []
    for name in sorted(available_methods()):
        parts = load_preset(name).get("parts", {})
        if parts.get("context") == "hints" or parts.get("signal") == "imitate":
            out.append(name)
    return out


def test_the_hint_methods_are_found():
    assert {"sdar_hints", "hint_distill", "hint_imitation"} <= set(hint_methods())


@pytest.mark.parametrize("name", hint_methods())
def test_the_students_prompts_never_carry_the_hint(tiny_model_dir, name):
    method = build_method({"name": name}, invalid_action_penalty=0.0, env_name="keyword")
    worker = rollout_worker(tiny_model_dir, "keyword")
    worker.env_cfg.options = {"hint_format": False}
    seen: list[str] = []
    real_generate = worker.engine.generate

    def generate(prompts, **kw):  # a spy: the real engine samples
        seen.extend(worker.tokenizer.decode(p) for p in prompts)
        return real_generate(prompts, **kw)

    worker.engine.generate = generate
    hints, rows = [], []
    try:
        for split, seed in (("train", 11), ("train", 12), ("valid", 0), ("valid", 1)):
            env = make_env("keyword", {"hint_format": False}, split=split)
            env.reset(seed)
            hints.append(env.privileged_hint())
            group = worker.run_group(
                task_seed=seed,
                split=split,
                group_size=2,
                temperature=1.0,
                sample_seed=seed,
                view=method.student_view(),
                demonstrate=split == "train" and method.wants_demonstrations(0),
            )
            rows += [r for e in group.episodes + group.demonstrations for r in e.turns]
            if name == "hint_imitation" and split == "train":
                assert group.demonstrations, "the hinted expert's episode is a demonstration"
    finally:
        worker.close()
    assert len(seen) >= 8 and rows
    texts = seen + [worker.tokenizer.decode(r.prompt_ids) for r in rows]
    texts += [m.content for r in rows for m in r.messages]
    for hint in hints:
        answer_block = hint.split(": ", 1)[1]
        assert not any(hint in t or answer_block in t for t in texts)
    assert not any("<answer>" in t for t in texts)  # hint_format=false: only a hint would show it
