"""The learner: a DeepSpeed engine executing ``policy_loss + sum(coef_k * component_k)``.

Method-blind: it runs the policy loss (PPO clip + dual clip, with the configured off-policy
correction), the entropy bonus, an optional k3 KL to the frozen initial policy, and whatever
auxiliary terms the batch carries (looked up by kind: ``pipeline.algorithm.aux_losses.aux_loss``). It never
knows which method built the batch.

One ``train_step`` is one optimizer step per mini-batch. Inside a mini-batch the rows are cut into
micro-batches by token budget; every micro-batch loss is divided by the token count of the whole
mini-batch (across data-parallel ranks), so the accumulated gradient is that of the full-batch
token mean. DeepSpeed runs with ``managed_gradient_accumulation: false``: backward only
accumulates, ``step()`` is the boundary (reduce across ranks, clip, update).

Proximal log-probs (decoupled PPO) are the current weights' log-probs before the step's first
update. For the first mini-batch they are the detached log-probs of the very forward that computes
the loss, so no extra pass is needed; later mini-batches get theirs from a no-grad pass made before
the first update.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from functools import partial
from pathlib import Path

import torch

from actors.learner_memory import memory_breakdown, rss_peak_gb
from actors.learner_setup import chunk_the_bf16_step, copy_tokenizer, ds_config, lr_lambda, make_optimizer
from actors.learner_weights import WeightSource, check_finite
from pipeline.algorithm.layer_checkpoint import check_supported
from pipeline.algorithm.logprobs import decoder_and_head, forward_response
from pipeline.algorithm.metrics import Metrics, Reduce, Stat, combine, reduce_micro_batches, to_report
from pipeline.algorithm.objective import denominators, micro_batch_objective
from pipeline.algorithm.shared_prefix import carried_tokens, forward_shared
from pipeline.core.config import LearnerConfig
from pipeline.core.hardware import choose_precision
from pipeline.core.microbatch import (
    null_micro_batch,
    padded_tokens,
    prefix_runs,
    slice_rows,
    sort_by_length,
    sort_by_tokens,
    split_by_tokens,
    to_device,
)
from pipeline.core.types import TrainBatch


class LearnerWorker(WeightSource):
    """Plain class (testable without Ray); ``actors.learner_actor.LearnerActor`` is its Ray shell."""

    def __init__(
        self,
        cfg: LearnerConfig,
        model_path: str,
        *,
        temperature: float,
        total_steps: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
    ):
        self.cfg = cfg
        self.model_path = model_path
        self.temperature = temperature
        self.total_steps = total_steps
        self.rank, self.world_size = rank, world_size
        self.seed = seed
        self.version = 0  # optimizer steps taken = weights version
        self.engine = None
        self._chunked = False  # learner.optimizer_chunk_mb took effect (setup)
        self.ref_model = None
        self.precision = None  # PrecisionChoice, resolved in setup() where the device is known
        self._carried = [0, 0]  # this step's (attended, padded) tokens through the forward passes
        self._skipped = 0  # this step's discarded optimizer updates

    # ----- setup ---------------------------------------------------------------------------------
    def setup(self) -> dict:
        """Build model, optimizer and DeepSpeed engine. Needs the process group env (see
        ``init_process_group_env``) when world_size > 1."""
        import deepspeed
        from deepspeed.accelerator import get_accelerator
        from transformers import AutoModelForCausalLM

        t0 = time.time()
        self.precision = choose_precision(self.cfg.precision, get_accelerator().device_name())
        torch.manual_seed(self.seed)
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        if self.cfg.gradient_checkpointing and self._shared:
            # the shared-prefix forward checkpoints layer by layer itself (HF's would drop its caches):
            # a decoder it cannot run is refused now, at setup, not at the first step
            check_supported(decoder_and_head(model)[0])
        elif self.cfg.gradient_checkpointing:  # torch's non-reentrant form: no input needs a grad of its own
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        optimizer = make_optimizer(self.cfg, model.parameters())
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(self.cfg, self.total_steps))
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config(self.cfg, self.precision.dtype)
        )
        self._chunked = chunk_the_bf16_step(self.engine.optimizer, self.cfg.optimizer_chunk_mb)
        if self.cfg.optimizer_chunk_mb > 0 and not self._chunked and self.rank == 0:
            print(
                f"privy-rl: learner.optimizer_chunk_mb={self.cfg.optimizer_chunk_mb} has no effect here: it chunks "
                f"DeepSpeed's bf16 update at ZeRO-0, and this learner runs {type(self.engine.optimizer).__name__}",
                flush=True,
            )
        if self.cfg.kl_coef > 0:
            self.ref_model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
            self.ref_model.eval().requires_grad_(False).to(self.device)  # beside the policy
        self._rss_start = rss_peak_gb()  # the model and optimizer loaded, before any step
        return {"learner/setup_seconds": time.time() - t0}

    @property
    def _shared(self) -> bool:
        """Rows through their shared prefixes (``learner.shared_tokens``), else as given."""
        return bool(self.cfg.unpadded and self.cfg.shared_tokens)

    @property
    def _forward(self):
        chunk = self.cfg.head_chunk_tokens
        if self._shared:
            return partial(forward_shared, checkpoint=self.cfg.gradient_checkpointing, head_chunk=chunk)
        return partial(forward_response, head_chunk=chunk)

    @property
    def module(self) -> torch.nn.Module:
        return self.engine.module

    @property
    def device(self) -> torch.device:
        """Where the engine's weights live (cuda:0 of the GPUs Ray made visible, or cpu)."""
        return torch.device(self.engine.device)

    # ----- the step ------------------------------------------------------------------------------
    def _micro_batches(self, batch: TrainBatch) -> tuple[list[TrainBatch], int]:
        """The rank's micro-batches of ``batch`` and how many of them are real.

        Ranks cut their own rows by token budget, so with rows of different lengths they get
        different counts; but every micro-batch forward/backward holds collectives (ZeRO-2 reduces
        gradients in backward, ZeRO-3 gathers parameters in forward), so all ranks must run the
        same number. They agree on the largest count and pad with null micro-batches: one row with
        no response token, whose loss is exactly 0 (zero gradients, the collectives still run).
        """
        if self._shared:
            mbs = [slice_rows(batch, a, b) for a, b in prefix_runs(batch, self.cfg.shared_tokens)]
        elif self.cfg.unpadded:
            mbs = [slice_rows(batch, i, i + 1) for i in range(batch.n_rows)]
        else:
            mbs = split_by_tokens(batch, self.cfg.micro_batch_tokens)
        n_real = len(mbs)
        if self.world_size > 1:
            n_max = int(self._all_reduce(torch.tensor(n_real, device=self.device), "max"))
            mbs += [null_micro_batch(mbs[0])] * (n_max - n_real)
        return mbs, n_real

    @torch.no_grad()
    def logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """Current-policy log-probs of the batch's tokens, ``[B, T]`` (no grad)."""
        out = torch.zeros_like(batch.behaviour_logprobs)
        row = 0
        mbs, n_real = self._micro_batches(batch)
        for i, mb in enumerate(mbs):
            fw = self._read(mb.input_ids, mb.attention_mask, mb.response_mask)
            if i < n_real:
                out[row : row + mb.n_rows, : mb.input_ids.shape[1]] = fw.logprobs
                row += mb.n_rows
        return out

    def train_step(self, minibatches: list[TrainBatch]) -> dict[str, tuple[float, str]]:
        """One optimizer step per mini-batch; returns the step's metrics with their reductions
        (token means over the step; ``pipeline.algorithm.metrics``)."""
        t0 = time.time()
        self.module.train()
        # Rollout workers send CPU tensors; the forward runs where the weights are.
        # rows that share a prefix next to each other (their micro-batches forward it once), or
        # padded micro-batches of rows of like length
        order = sort_by_tokens if self._shared else sort_by_length
        minibatches = [order(to_device(mb, self.device)) for mb in minibatches]
        self._carried, self._skipped = [0, 0], 0
        # Proximal log-probs = the weights before the step's first update. The first mini-batch
        # takes them from its own forward; later ones need a no-grad pass now, when the decoupled
        # correction or an aux term (whose importance weight is against them) uses them.
        need_prox = self.cfg.correction == "decoupled" or any(mb.aux_terms for mb in minibatches)
        prox = [None] + [self.logprobs(mb) if need_prox else None for mb in minibatches[1:]]
        per_mb = [self._minibatch(mb, prox_lp) for mb, prox_lp in zip(minibatches, prox)]
        # Each mini-batch's means are over its own tokens: weight them by those token counts.
        out = combine([m for m, _ in per_mb], weights=[n for _, n in per_mb])
        out["learner/tokens"] = (float(sum(mb.n_tokens for mb in minibatches)), Reduce.SUM)
        out["learner/seconds"] = (time.time() - t0, Reduce.MAX)
        out["learner/lr"] = (float(self.engine.get_lr()[0]), Reduce.FIRST)
        out["learner/padding_frac"] = (1.0 - self._carried[0] / max(self._carried[1], 1), Reduce.MAX)
        # what the training forwards carried: real tokens (prompt + response) and padding, apart
        out["learner/forwarded_tokens"] = (float(self._carried[0]), Reduce.SUM)
        out["learner/padding_tokens"] = (float(self._carried[1] - self._carried[0]), Reduce.SUM)
        for kind, gb in self._memory.items():
            out[f"learner/memory/{kind}_gb"] = (gb, Reduce.MAX)
        out["learner/memory/rss_start_gb"] = (self._rss_start, Reduce.MAX)
        # Optimizer updates discarded for non-finite gradients (the ranks always agree).
        out["learner/skipped_updates"] = (float(self._skipped), Reduce.FIRST)
        if self._chunked:  # the updates DeepSpeed's bf16 wrapper made in chunks, since setup
            out["learner/chunked_optimizer_steps"] = (float(self.engine.optimizer.chunked_steps), Reduce.FIRST)
        return out

    def _minibatch(self, batch: TrainBatch, prox_lp: torch.Tensor | None) -> tuple[dict[str, tuple[float, str]], float]:
        """One optimizer step over ``batch``; returns its metrics and its token count (all ranks)."""
        den = denominators(batch, lambda x: self._all_reduce(x, "sum"), self.world_size)
        parts: dict[str, list[Metrics]] = defaultdict(list)  # metric prefix -> per-micro-batch metrics
        row, nonfinite = 0, 0
        mbs, n_real = self._micro_batches(batch)
        if self._shared:  # no padding, each shared prefix once
            real = padded = sum(carried_tokens(mb.input_ids, mb.attention_mask) for mb in mbs[:n_real])
        else:
            real, padded = padded_tokens(mbs[:n_real])
        self._carried = [self._carried[0] + real, self._carried[1] + padded]
        for i, mb in enumerate(mbs):
            proximal = None  # the forward's own log-probs (the first mini-batch, a null micro-batch)
            if prox_lp is not None and i < n_real:
                proximal = prox_lp[row : row + mb.n_rows, : mb.input_ids.shape[1]]
                row += mb.n_rows
            self._begin_forward()
            loss, mb_parts = micro_batch_objective(
                self.module,
                mb,
                den,
                self.cfg,
                temperature=self.temperature,
                proximal=proximal,
                ref_model=self.ref_model,
                teacher_logits=self._teacher_logits,
                forward=self._forward,
            )
            for prefix, m in mb_parts.items():
                parts[prefix].append(m)
            if not torch.isfinite(loss.detach()):
                # NaN * anything is NaN: every gradient of the update becomes NaN, so the invalid
                # norm discards the whole update on every rank (DeepSpeed's own check or ours).
                nonfinite += 1
                loss = loss * float("nan")
            self.engine.backward(loss, scale_wrt_gas=False)
        # Without ZeRO, DeepSpeed clips but does not record the norm: measure it before the step
        # (with several ZeRO-0 ranks this is rank 0's norm before the all-reduce).
        pre_norm = self._local_grad_norm() if self.cfg.zero_stage == 0 else None
        grads_gb = memory_breakdown(self.engine)["gradients"]  # before the update frees them
        applied = self._optimizer_step(pre_norm)
        # where this rank's memory went (the optimizer's state exists from the first update on)
        self._memory = {**memory_breakdown(self.engine), "gradients": grads_gb}
        self.version += 1  # a skipped update is still a step: versions count training steps
        out: Metrics = {f"{prefix}/{k}": v for prefix, ms in parts.items() for k, v in reduce_micro_batches(ms).items()}
        gn = self.engine.get_global_grad_norm()
        gn = pre_norm if gn is None else gn
        if gn is not None and applied:
            out["learner/grad_norm"] = Stat(float(gn), Reduce.FIRST)
        self._skipped += 0 if applied else 1
        out["learner/nonfinite_microbatches"] = Stat(float(nonfinite), Reduce.SUM)
        return to_report(out), float(den.total * self.world_size)

    def _optimizer_step(self, pre_norm: float | None) -> bool:
        """The update, unless the gradients are not finite: then no parameter or optimizer state
        changes (nor the lr schedule). Returns whether it was applied. DeepSpeed's optimizer
        wrappers (ZeRO 1-3, bf16) discard an invalid-norm update themselves, on every rank; the
        plain torch optimizer of fp32 ZeRO-0 has no such check, so the ranks agree here."""
        if hasattr(self.engine.optimizer, "overflow"):
            self.engine.step()
            return self.engine.was_step_applied()
        bad = torch.tensor(0.0 if pre_norm is not None and math.isfinite(pre_norm) else 1.0, device=self.device)
        if float(self._all_reduce(bad, "max")) > 0:
            self.engine.zero_grad()
            return False
        self.engine.step()
        return True

    def _local_grad_norm(self) -> float:
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        return (
            float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) if grads else 0.0
        )

    def _begin_forward(self) -> None:
        """What ``engine.forward`` does before a forward; we call the HF module directly, so do it
        here. ZeRO-3 counts micro-steps in it: without it every backward overwrites the gradient
        partitions instead of adding to them (only the last micro-batch's gradient survives)."""
        opt = getattr(self.engine, "optimizer", None)
        if hasattr(opt, "clear_backward_seen_flag"):
            opt.clear_backward_seen_flag()

    @torch.no_grad()
    def _teacher_logits(self, mb: TrainBatch) -> torch.Tensor:
        """Teacher = current weights on the privileged prompt, stop-gradient (estimator ``full``)."""
        if mb.teacher_input_ids is None:
            raise ValueError("an aux term of kind full_kl needs teacher_input_ids in the batch")
        return self._read(mb.teacher_input_ids, mb.teacher_attention_mask, mb.teacher_response_mask, True).logits

    def _read(self, ids: torch.Tensor, attn: torch.Tensor, resp: torch.Tensor, with_logits: bool = False):
        """The current weights' forward over rows, no entropy (the no-grad reads of a step)."""
        return self._forward(
            self.module, ids, attn, resp, temperature=self.temperature, with_entropy=False, with_logits=with_logits
        )

    def _all_reduce(self, x: torch.Tensor, op: str) -> torch.Tensor:
        """``x`` reduced over the data-parallel ranks (``op``: sum | max); ``x`` at world size 1."""
        if self.world_size > 1:
            import torch.distributed as dist

            x = x.clone()
            dist.all_reduce(x, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        return x

    # ----- checkpoint ----------------------------------------------------------------------------
    def save_checkpoint(self, ckpt_dir: str, *, hf: bool = True) -> None:
        """DeepSpeed state (model, optimizer, scheduler) + an HF-format model for transformers.
        The weights are gathered (and checked finite) before anything is written."""
        path = Path(ckpt_dir)
        # ZeRO-3: every rank must take part in the gather; other ranks check their full copy
        sd = self.state_dict_for_sync() if self.rank == 0 or self.cfg.zero_stage == 3 else None
        if sd is None:
            check_finite(self.module.state_dict(), f"the weights after step {self.version}")
        self.engine.save_checkpoint(str(path / "deepspeed"), tag="state", client_state={"version": self.version})
        if hf and self.rank == 0:
            self.module.save_pretrained(str(path / "hf"), state_dict=sd, safe_serialization=True)
            copy_tokenizer(self.model_path, path / "hf")

    def load_checkpoint(self, ckpt_dir: str) -> int:
        _, client = self.engine.load_checkpoint(str(Path(ckpt_dir) / "deepspeed"), tag="state")
        self.version = int(client["version"])
        return self.version
