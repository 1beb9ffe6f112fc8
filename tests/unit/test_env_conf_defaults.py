"""conf/env/*.yaml must not silently contradict the env's own documented defaults."""

from pathlib import Path

import pytest
import yaml

from envs import env_class

CONF_ENV = Path(__file__).resolve().parents[2] / "conf" / "env"


@pytest.mark.parametrize("path", sorted(CONF_ENV.glob("*.yaml")), ids=lambda p: p.stem)
def test_invalid_action_penalty_matches_the_env_default(path):
    conf = yaml.safe_load(path.read_text())
    penalty = conf.get("invalid_action_penalty")
    if penalty is None:  # null = the env's own default
        return
    assert penalty == pytest.approx(env_class(conf["name"]).invalid_action_penalty), (
        f"{path.name}: invalid_action_penalty {penalty} differs from {conf['name']}'s documented default "
        f"{env_class(conf['name']).invalid_action_penalty}"
    )
