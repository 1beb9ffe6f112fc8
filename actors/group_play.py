"""One group in play inside a rollout worker (``actors/rollout.py``): each episode alternates a
generate request (the worker's turn batcher) and an env step (its pool), on its own, until every
episode has ended; the result is one complete ``EpisodeGroup``."""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, wait

from actors.engines.base import request_seed
from actors.turn_batcher import Request, Sampling
from envs import make_env
from pipeline.context.providers import StudentView
from pipeline.context.student_prompts import ContextFull
from pipeline.core.types import Episode, EpisodeGroup, StopReason, TurnRecord


class GroupPlay:
    """One group in play: each episode alternates a generate request and an env step, on its own.

    Its episodes ``join`` the batcher when play starts and ``leave`` it when they end (or the
    group is abandoned), so that a generate call waits briefly for the ones in env calls."""

    def __init__(
        self,
        worker,  # the RolloutWorker that plays it (its batcher, env pool, prompt builder)
        envs: list,
        task_seed: int,
        split: str,
        temperature: float,
        sample_seed: int,
        max_turns: int | None,
        view: StudentView | None,
        t0: float,
    ):
        self.w, self.envs, self.task_seed, self.split = worker, envs, task_seed, split
        self.sampling = Sampling(
            max_new_tokens=worker.cfg.max_new_tokens, temperature=temperature, top_p=worker.cfg.top_p
        )
        self.sample_seed, self.view, self.t0 = sample_seed, view, t0
        self.limit = max_turns  # None: the env's own max_turns, known after the first reset
        self.n_tokens = 0
        self.live = 0  # episodes joined to the batcher and not yet left
        n, name = len(envs), worker.env_cfg.name
        self.episodes = [Episode(task_id=f"{name}-{task_seed}", env_name=name, seed=task_seed) for _ in range(n)]
        self.obs: list = [None] * n
        self.history: list[list[tuple[str, str]]] = [[] for _ in range(n)]
        # future -> (kind, episode index, [start time once running], data)
        self.pending: dict[Future, tuple[str, int, list, object]] = {}

    # ----- the two kinds of work an episode waits on ---------------------------------------------
    def _env_call(self, kind: str, i: int, fn, *args, data=None) -> None:
        """Run ``fn`` in the env pool; its clock for ``rollout.env_timeout_s`` starts when it runs
        (queueing behind other envs' calls does not count)."""
        started: list[float] = []

        def run():
            started.append(time.time())
            return fn(*args)

        self.pending[self.w.env_pool.submit(run)] = (kind, i, started, data)

    def _landed(self, i: int, *, ask: bool) -> None:
        """An env call of episode i is over: it asks for its next turn, or it has ended."""
        if ask:
            self._ask(i)
        else:
            self.w.batcher.leave(1)
            self.live -= 1

    def _ask(self, i: int) -> None:
        w, ep = self.w, self.episodes[i]
        turn = len(ep.turns)
        last = ep.turns[-1] if ep.turns else None
        try:
            messages, ids, truncated, offered = w.build_prompt(
                self.envs[i], self.history[i], self.obs[i], turn, self.view, last
            )
        except ContextFull:  # env.prompt_format=chat: the episode ends where its context does
            ep.stop_reason = StopReason.CONTEXT
            return self._landed(i, ask=False)
        for cid in offered:
            if cid not in ep.context_ids:
                ep.context_ids.append(cid)
        req = Request(prompt=ids, sampling=self.sampling, seed=request_seed(self.sample_seed * 1000 + turn, i))
        w.batcher.submit([req])
        self.pending[req.future] = ("gen", i, [], (messages, ids, truncated))

    def _fail(self, i: int, what: str, err: BaseException | str) -> None:
        self.episodes[i].error = f"{what}: {err}"[:500]
        self.episodes[i].stop_reason = StopReason.ERROR

    # ----- the loop ------------------------------------------------------------------------------
    def play(self) -> EpisodeGroup:
        w = self.w
        w.batcher.join(len(self.envs))
        self.live = len(self.envs)
        try:
            for i in range(len(self.envs)):
                self._env_call("reset", i, self._make_and_reset, i)
            while self.pending:
                done = self._wait()
                for f in done:
                    kind, i, _, data = self.pending.pop(f)
                    {"reset": self._on_reset, "gen": self._on_generation, "step": self._on_step}[kind](i, f, data)
        finally:
            w.batcher.leave(self.live)  # nothing more will come from an abandoned group
        return EpisodeGroup(
            task_id=self.episodes[0].task_id,
            seed=self.task_seed,
            episodes=self.episodes,
            worker_id=w.worker_id,
            rollout_seconds=time.time() - self.t0,
            n_generated_tokens=self.n_tokens,
        )

    def _wait(self) -> set[Future]:
        """The next finished futures; env calls that ran out of time fail their episodes."""
        timeout = self.w.cfg.env_timeout_s
        env_calls = [(f, t) for f, (kind, _, t, _) in self.pending.items() if kind != "gen"]
        running = [t[0] for _, t in env_calls if t]
        until = min(running) + timeout - time.time() if running else None
        if any(not t for _, t in env_calls):  # re-check soon: a queued call's clock starts when it runs
            until = 1.0 if until is None else min(until, 1.0)
        done, _ = wait(
            list(self.pending), timeout=None if until is None else max(until, 0.0), return_when=FIRST_COMPLETED
        )
        now = time.time()
        for f, t in env_calls:
            if f not in done and t and now - t[0] >= timeout:  # a hung env: its episode ends as failed
                kind, i, _, _ = self.pending.pop(f)
                self._fail(i, f"env {kind}", f"no answer within rollout.env_timeout_s={timeout:g} s")
                self._landed(i, ask=False)
        return done

    def _make_and_reset(self, i: int):
        env = make_env(self.w.env_cfg.name, self.w.env_cfg.options, self.split)
        self.envs[i] = env
        obs = env.reset(self.task_seed)
        # Under the env timeout and off this loop: code_edit's hint runs the tests in its sandbox.
        return env, obs, env.privileged_hint() or ""

    def _on_reset(self, i: int, f: Future, _) -> None:
        try:
            env, self.obs[i], hint = f.result()
        except Exception as e:  # a broken env fails its episode only
            self._fail(i, "env reset", repr(e))
            return self._landed(i, ask=False)
        ep = self.episodes[i]
        ep.privileged_hint = hint
        ep.task_id = env.task_id or ep.task_id
        ep.task_type, ep.task_text = env.task_type, env.task_text
        self.limit = self.limit or env.max_turns
        self._landed(i, ask=True)

    def _on_generation(self, i: int, f: Future, data) -> None:
        gen, version = f.result()  # an engine failure ends the group: it is the worker's, not the episode's
        text = self.w.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        self.n_tokens += gen.n_tokens
        self._env_call("step", i, self.envs[i].step, text, data=(*data, gen, version, text))

    def _on_step(self, i: int, f: Future, data) -> None:
        messages, ids, truncated, gen, version, text = data
        try:
            res = f.result()
        except Exception as e:
            self._fail(i, "env step", repr(e))
            return self._landed(i, ask=False)
        ep, obs = self.episodes[i], self.obs[i]
        turn = len(ep.turns)
        ep.turns.append(
            TurnRecord(
                prompt_ids=ids,
                response_ids=list(gen.token_ids),
                behaviour_logprobs=list(gen.logprobs),
                policy_version=version,
                turn_index=turn,
                messages=messages,
                response_text=text,
                action=res.action,
                step_reward=res.reward,
                action_valid=res.action_valid,
                anchor_obs=obs.text,
                thinking_len=self.w.thinking_tokens(gen.token_ids, text),
                truncated_prompt=truncated,
            )
        )
        ep.reward += res.reward
        self.history[i].append((obs.text, res.action if res.action_valid else text.strip()))
        self.obs[i] = res.observation
        if res.criteria:
            ep.criteria = list(res.criteria)
        ep.won = ep.won or res.won
        if res.done:
            ep.stop_reason = StopReason.WON if res.won else StopReason.DONE
        self._landed(i, ask=not res.done and turn + 1 < self.limit)
