"""ALFWorld's own text engine for one game: ``PddlEnv`` + ``AlfredDemangler`` + ``AlfredInfos``.

This is the stack ``AlfredTWEnv.init_env`` builds, minus textworld's asynchronous batch env:
each of our envs plays one game in-process.

``PddlEnv`` loads a private temporary copy of the Fast Downward library, so engines in one
process are independent. That copy is never unloaded (the C++ library cannot be ``dlclose``d:
about 1.4 MB and 5 mappings stay behind per ``PddlEnv``), so ``release_engine`` keeps finished
``PddlEnv`` objects in a per-process pool and ``load_engine`` reuses them, the way textworld's
own gym env loads game after game into one ``PddlEnv``. Memory then follows the number of
*concurrent* envs, not the number of episodes played.

Translating PDDL to SAS (Fast Downward's Python translator) is most of a load or a reset, and
textworld does it four times per game (twice in ``load``, twice again in ``reset``). It is a pure
function of (domain, problem) and textworld only reads its result, so on first use we point
textworld's PDDL logic at a memoised ``pddl2sas``: a reset then translates nothing that an env
of the same game (the G copies of a GRPO group) already translated. The wrapper also restores
``sys.argv``, which Fast Downward's translator overwrites.

The planner expert (``AlfredExpert``) is added only on request: it replans after every step,
with every distractor object in the problem; on small scenes that is tens of milliseconds, on a
whole kitchen with two target objects it measured up to 100 s. ``AlfredExpert``'s first positional parameter is the
env to wrap, so the expert type must be passed by keyword (ALFWorld's own ``init_env`` passes it
positionally and silently gets the handcoded expert).
"""

from __future__ import annotations

import functools
import sys
import threading

import fast_downward
import textworld
import textworld.envs.pddl.logic as pddl_logic
from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredExpert, AlfredExpertType, AlfredInfos
from textworld.envs import PddlEnv

_POOL_MAX = 64  # idle PddlEnvs kept per process
_idle: list[PddlEnv] = []
_lock = threading.Lock()


class _MemoisedFastDownward:
    """The ``fast_downward`` module as textworld's PDDL logic sees it, with ``pddl2sas`` memoised."""

    def __getattr__(self, name):
        return getattr(fast_downward, name)

    @staticmethod
    @functools.lru_cache(maxsize=16)
    def pddl2sas(domain: str, problem: str, verbose: bool = False, optimize: bool = False):
        argv = sys.argv[:]  # fast_downward.pddl2sas overwrites sys.argv for its option parser
        try:
            return fast_downward.pddl2sas(domain, problem, verbose=verbose, optimize=optimize)
        finally:
            sys.argv[:] = argv


def _memoise_translation() -> None:
    if not isinstance(pddl_logic.fast_downward, _MemoisedFastDownward):
        pddl_logic.fast_downward = _MemoisedFastDownward()


def load_engine(gamefile: str, *, expert: bool = False, walkthrough: bool = False):
    """A wrapped, loaded (not yet reset) engine for ``gamefile``; hand it back with ``release_engine``.

    The state after ``reset()`` / ``step()`` carries ``feedback``, ``won``,
    ``admissible_commands`` (sorted), ``extra.gamefile``, and on request ``extra.expert_plan``
    (the planner's plan, recomputed every step) and ``extra.walkthrough`` (the stored plan from
    the initial state, or the planner's when none is stored).
    """
    extras = ["gamefile"] + (["walkthrough"] if walkthrough else []) + (["expert_plan"] if expert else [])
    infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=extras)
    with _lock:
        _memoise_translation()
        pddl = _idle.pop() if _idle else None
    if pddl is None:
        pddl = PddlEnv(infos)
    pddl.request_infos = infos  # AlfredExpert.load edits it, so every game gets a fresh one
    env = AlfredInfos(AlfredDemangler(pddl))
    if expert:
        env = AlfredExpert(env, expert_type=AlfredExpertType.PLANNER)
    try:
        env.load(gamefile)
    except BaseException:
        release_engine(env)
        raise
    return env


def release_engine(env) -> None:
    """Return the engine's ``PddlEnv`` to the pool; ``env`` must not be used afterwards."""
    pddl = env.unwrapped
    with _lock:
        if len(_idle) < _POOL_MAX and all(p is not pddl for p in _idle):
            _idle.append(pddl)


def replan(env) -> list[str]:
    """The planner's plan from the engine's current state (Fast Downward; slow on big scenes)."""
    pddl = env.unwrapped
    return list(pddl._pddl_state.replan(pddl._entity_infos))
