"""The learner: a DeepSpeed engine executing ``policy_loss + sum(coef_k * component_k)``.

Method-blind: it runs the policy loss (PPO clip + dual clip, with the configured off-policy
correction), the entropy bonus, an optional k3 KL to the frozen initial policy, and whatever
auxiliary terms the batch carries (looked up by kind in ``pipeline.algorithm.losses.AUX_LOSSES``). It never
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
import os
import time
from collections import defaultdict
from pathlib import Path

import torch

from pipeline.algorithm.logprobs import forward_response
from pipeline.algorithm.losses import (
    AUX_LOSSES,
    AUX_NEEDS_LOGITS,
    LossInputs,
    entropy_bonus,
    kl_to_reference,
    policy_loss,
)
from pipeline.algorithm.metrics import Metrics, Reduce, Stat, combine, mean, reduce_micro_batches, to_report
from pipeline.core.config import LearnerConfig
from pipeline.core.hardware import choose_precision, hardware_info, set_threads
from pipeline.core.microbatch import null_micro_batch, padded_tokens, sort_by_length, split_by_tokens, to_device
from pipeline.core.types import TrainBatch


def ds_config(cfg: LearnerConfig, dtype: str) -> dict:
    """The DeepSpeed config for our own micro-batching (batch sizes are nominal); ``dtype`` is
    the resolved ``learner.precision`` (bf16 = bf16 compute with fp32 master weights)."""
    conf = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": {"stage": cfg.zero_stage},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if dtype == "bf16":
        conf["bf16"] = {"enabled": True}
    # ZeRO-Offload: optimizer state (ZeRO >= 1) and parameters (ZeRO-3) in pinned CPU memory.
    if cfg.offload_optimizer:
        conf["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if cfg.offload_params:
        conf["zero_optimization"]["offload_param"] = {"device": "cpu", "pin_memory": True}
    return conf


def lr_lambda(cfg: LearnerConfig, total_steps: int):
    """The lr multiplier of optimizer step ``k`` (the scheduler steps once per mini-batch).

    ``warmup_steps`` and ``total_steps`` count training steps, each of ``learner.mini_batches``
    optimizer steps, so the schedule runs over ``total_steps * mini_batches`` optimizer steps:
    linear warmup over the first ``warmup_steps * mini_batches``, then constant or cosine to 0 at
    the last one.
    """
    per_step = cfg.mini_batches
    warmup, total = cfg.warmup_steps * per_step, total_steps * per_step

    def f(k: int) -> float:
        if warmup and k < warmup:
            return (k + 1) / warmup
        if cfg.lr_schedule == "cosine":
            span = max(1, total - warmup)
            return 0.5 * (1 + math.cos(math.pi * min(1.0, (k - warmup) / span)))
        return 1.0

    return f


class LearnerWorker:
    """Plain class (testable without Ray); ``LearnerActor`` below is its Ray shell."""

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
        if self.cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        model.config.use_cache = False
        if self.cfg.offload_optimizer:
            # DeepSpeed refuses a client torch optimizer with ZeRO-Offload (the CPU step would be
            # slow); its CPU Adam (JIT-built once, about 30 s) runs the same AdamW update.
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            optimizer = DeepSpeedCPUAdam(
                model.parameters(),
                lr=self.cfg.lr,
                betas=tuple(self.cfg.betas),
                weight_decay=self.cfg.weight_decay,
                adamw_mode=True,
            )
        else:
            optimizer = torch.optim.AdamW(
                model.parameters(), lr=self.cfg.lr, betas=tuple(self.cfg.betas), weight_decay=self.cfg.weight_decay
            )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(self.cfg, self.total_steps))
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config(self.cfg, self.precision.dtype)
        )
        if self.cfg.kl_coef > 0:
            self.ref_model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
            self.ref_model.eval().requires_grad_(False).to(self.device)  # beside the policy
        return {"learner/setup_seconds": time.time() - t0}

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
            fw = forward_response(
                self.module,
                mb.input_ids,
                mb.attention_mask,
                mb.response_mask,
                temperature=self.temperature,
                with_entropy=False,
            )
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
        minibatches = [sort_by_length(to_device(mb, self.device)) for mb in minibatches]
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
        # Optimizer updates discarded for non-finite gradients (the ranks always agree).
        out["learner/skipped_updates"] = (float(self._skipped), Reduce.FIRST)
        return out

    def _minibatch(self, batch: TrainBatch, prox_lp: torch.Tensor | None) -> tuple[dict[str, tuple[float, str]], float]:
        """One optimizer step over ``batch``; returns its metrics and its token count (all ranks)."""
        cfg = self.cfg
        # token_mean's denominator: tokens of the whole mini-batch over all ranks (with the rows
        # left out for a zero loss), divided by the world size because DeepSpeed averages
        # gradients across ranks.
        mask_sum = batch.response_mask.sum()
        # Rows outside a "policy_mask" (demonstrations) are no policy's samples: the policy term,
        # the entropy bonus and the reference KL leave them out of sum and denominator alike.
        policy_sum = (batch.response_mask * batch.aux["policy_mask"]).sum() if "policy_mask" in batch.aux else mask_sum
        extra = mask_sum.new_tensor(batch.extra_loss_tokens)
        counts = self._all_reduce(torch.stack([mask_sum, extra, policy_sum]), "sum")
        n_global = counts[0] + counts[1]
        n_total = n_global / self.world_size
        n_policy = (counts[2] + counts[1]) / self.world_size
        kept = (counts[2] / (counts[2] + counts[1])).clamp_min(1e-12)  # the entropy metric: over the kept tokens
        needs_logits = any(t.kind in AUX_NEEDS_LOGITS for t in batch.aux_terms)
        parts: dict[str, list[Metrics]] = defaultdict(list)  # metric prefix -> per-micro-batch metrics
        row, nonfinite = 0, 0
        mbs, n_real = self._micro_batches(batch)
        real, padded = padded_tokens(mbs[:n_real])
        self._carried = [self._carried[0] + real, self._carried[1] + padded]
        for i, mb in enumerate(mbs):
            self._begin_forward()
            fw = forward_response(
                self.module,
                mb.input_ids,
                mb.attention_mask,
                mb.response_mask,
                temperature=self.temperature,
                with_entropy=True,
                with_logits=needs_logits,
            )
            lp, mask = fw.logprobs, mb.response_mask
            pmask = mask * mb.aux["policy_mask"] if "policy_mask" in mb.aux else mask
            t = mb.input_ids.shape[1]
            if prox_lp is None or i >= n_real:
                proximal = lp.detach()
            else:
                proximal = prox_lp[row : row + mb.n_rows, :t]
                row += mb.n_rows
            pg, m = policy_loss(
                lp,
                mb.behaviour_logprobs,
                mb.advantages,
                pmask,
                n_policy,
                clip_low=cfg.clip_low,
                clip_high=cfg.clip_high,
                dual_clip=cfg.dual_clip,
                correction=cfg.correction,
                proximal_logprobs=proximal,
                behaviour_cap=cfg.behaviour_cap,
            )
            loss = batch.policy_loss_coef * pg
            ent, em = entropy_bonus(fw.entropy, pmask, n_policy)
            m.update({k: Stat(v.value / kept, v.reduce) for k, v in em.items()})
            loss = loss - batch.entropy_coef * ent
            if self.ref_model is not None:
                with torch.no_grad():
                    ref = forward_response(
                        self.ref_model,
                        mb.input_ids,
                        mb.attention_mask,
                        mask,
                        temperature=self.temperature,
                        with_entropy=False,
                    ).logprobs
                kl, km = kl_to_reference(lp, ref, pmask, n_policy)
                loss = loss + cfg.kl_coef * kl
                m.update({f"ref_{k}": v for k, v in km.items()})
            parts["policy"].append(m)
            inputs = LossInputs(
                logprobs=lp,
                mask=mask,
                n_tokens_total=n_total,
                proximal_logprobs=proximal,
                input_ids=mb.input_ids,
                teacher_logprobs=mb.aux.get("teacher_logprobs"),
                distill_mask=mb.aux.get("distill_mask"),
                student_logits=fw.logits,
                teacher_logits=self._teacher_logits(mb) if needs_logits else None,
            )
            for term in batch.aux_terms:
                aux_loss, am = AUX_LOSSES[term.kind](inputs, **term.params)
                loss = loss + term.coef * aux_loss
                parts[term.name].append(am)
            parts["learner"].append({"loss": mean(loss)})
            if not torch.isfinite(loss.detach()):
                # NaN * anything is NaN: every gradient of the update becomes NaN, so the invalid
                # norm discards the whole update on every rank (DeepSpeed's own check or ours).
                nonfinite += 1
                loss = loss * float("nan")
            self.engine.backward(loss, scale_wrt_gas=False)
        # Without ZeRO, DeepSpeed clips but does not record the norm: measure it before the step
        # (with several ZeRO-0 ranks this is rank 0's norm before the all-reduce).
        pre_norm = self._local_grad_norm() if self.cfg.zero_stage == 0 else None
        applied = self._optimizer_step(pre_norm)
        self.version += 1  # a skipped update is still a step: versions count training steps
        out: Metrics = {f"{prefix}/{k}": v for prefix, ms in parts.items() for k, v in reduce_micro_batches(ms).items()}
        gn = self.engine.get_global_grad_norm()
        gn = pre_norm if gn is None else gn
        if gn is not None and applied:
            out["learner/grad_norm"] = Stat(float(gn), Reduce.FIRST)
        self._skipped += 0 if applied else 1
        out["learner/nonfinite_microbatches"] = Stat(float(nonfinite), Reduce.SUM)
        return to_report(out), float(n_global)

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
        fw = forward_response(
            self.module,
            mb.teacher_input_ids,
            mb.teacher_attention_mask,
            mb.teacher_response_mask,
            temperature=self.temperature,
            with_entropy=False,
            with_logits=True,
        )
        return fw.logits

    def _all_reduce(self, x: torch.Tensor, op: str) -> torch.Tensor:
        """``x`` reduced over the data-parallel ranks (``op``: sum | max); ``x`` at world size 1."""
        if self.world_size > 1:
            import torch.distributed as dist

            x = x.clone()
            dist.all_reduce(x, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        return x

    # ----- weights out ---------------------------------------------------------------------------
    def state_dict_for_sync(self, device: str | torch.device = "cpu", copy: bool = True) -> dict[str, torch.Tensor]:
        """Full fp32 weights on ``device`` (consolidated under ZeRO-3), rank 0 only. Under ZeRO-3
        every rank must call it (the gather is collective). ``copy=False`` may return the live
        parameters themselves (fine for a read-only use such as a broadcast)."""
        if self.cfg.zero_stage == 3:
            sd = self.engine._zero3_consolidated_16bit_state_dict()
        else:
            sd = self.module.state_dict()
        return {k: v.detach().to(device, copy=copy) for k, v in (sd or {}).items()}

    # Collective route (pipeline/distributed/collective_sync.py): rank 0 is rank 0 of a weight group of its
    # own; the consumers (rollout workers, a self-teacher scorer) are ranks 1..N.
    def sync_meta(self):
        """Ordered (name, dtype, shape) of the weights ``broadcast_weights`` sends (rank 0; other
        ranks return None). Every rank must call it under ZeRO-3."""
        from pipeline.distributed.collective_sync import meta_of

        if self.rank != 0 and self.cfg.zero_stage != 3:
            return None
        sd = self.state_dict_for_sync(copy=False)
        if self.rank != 0:
            return None
        self._sync_meta = meta_of(sd)  # broadcast_weights refuses a state dict that differs
        return self._sync_meta

    def init_weight_group(
        self,
        host: str,
        port: int,
        world_size: int,
        backend: str,
        *,
        bucket_bytes: int,
        timeout_s: float | None = None,
        store=None,
    ) -> str | None:
        """Rank 0 joins (and hosts, on ``store`` if it bound one already) the weight group as its
        rank 0; other ranks do nothing. Blocks until every member has joined. Returns the backend
        in use (rank 0)."""
        from pipeline.distributed.collective_sync import DEFAULT_TIMEOUT_S, init_group

        if self.rank != 0:
            return None
        self._weight_group = init_group(
            host, port, 0, world_size, backend, timeout_s=timeout_s or DEFAULT_TIMEOUT_S, tcp=store
        )
        self._sync_bucket_bytes = bucket_bytes
        return self._weight_group.backend

    def broadcast_weights(self, version: int) -> dict[str, float] | None:
        """Every rank calls it (ZeRO-3 gathers collectively); rank 0 broadcasts and returns the
        stats (seconds, bytes, buckets, gbps). With NCCL the weights go out from the current
        CUDA device, with gloo from CPU memory."""
        from pipeline.distributed.collective_sync import broadcast_state_dict

        if self.rank != 0:
            if self.cfg.zero_stage == 3:
                self.state_dict_for_sync(copy=False)  # take part in the gather
            return None
        group = self._weight_group
        sd = self.state_dict_for_sync(device=group.device, copy=False)  # read only: no copy
        return broadcast_state_dict(group, sd, version, self._sync_bucket_bytes, meta=getattr(self, "_sync_meta", None))

    # ----- checkpoint ----------------------------------------------------------------------------
    def save_checkpoint(self, ckpt_dir: str, *, hf: bool = True) -> None:
        """DeepSpeed state (model, optimizer, scheduler) + an HF-format model for transformers."""
        path = Path(ckpt_dir)
        self.engine.save_checkpoint(str(path / "deepspeed"), tag="state", client_state={"version": self.version})
        if hf and (self.rank == 0 or self.cfg.zero_stage == 3):
            sd = self.state_dict_for_sync()  # ZeRO-3: every rank must take part in the gather
            if self.rank == 0:
                self.module.save_pretrained(str(path / "hf"), state_dict=sd, safe_serialization=True)
                copy_tokenizer(self.model_path, path / "hf")

    def load_checkpoint(self, ckpt_dir: str) -> int:
        _, client = self.engine.load_checkpoint(str(Path(ckpt_dir) / "deepspeed"), tag="state")
        self.version = int(client["version"])
        return self.version


def copy_tokenizer(model_path: str, out: Path) -> None:
    import shutil

    for name in os.listdir(model_path):
        if name.startswith("tokenizer") or name in (
            "chat_template.jinja",
            "special_tokens_map.json",
            "generation_config.json",
        ):
            shutil.copy2(os.path.join(model_path, name), out / name)


def init_process_group_env(rank: int, world_size: int, master_addr: str, store) -> None:
    """Form DeepSpeed's process group on ``store`` (rank 0 hosts it, ``rendezvous.host_store``;
    the others joined it). Runs in the Ray shell, never in ``LearnerWorker.__init__``."""
    import deepspeed
    from deepspeed.constants import default_pg_timeout

    # DeepSpeed and its CPU shared-memory collectives still read these.
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": "0",
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(store.port),
        }
    )
    cuda = torch.cuda.is_available()
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if cuda else "cpu")
    if cuda:
        # Ray sets CUDA_VISIBLE_DEVICES to this actor's GPU(s): its device is always local 0.
        torch.cuda.set_device(0)
    backend = "nccl" if cuda else "gloo"
    torch.distributed.init_process_group(
        backend, store=store, rank=rank, world_size=world_size, timeout=default_pg_timeout
    )
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)  # adopts the group


_RENDEZVOUS_TIMEOUT_S = 900.0  # ranks start as Ray places them: minutes apart on a busy cluster


class LearnerActor:
    """Ray shell of one learner rank: process-group setup, then the plain worker.

    The driver asks rank 0 for ``node_address()`` (rank 0 binds the group's store there and then),
    then calls ``setup(addr, port)`` on every rank: the ranks meet at rank 0's node wherever Ray
    placed it (several nodes need a real IP, not loopback). A single rank may be given
    ``master_addr`` at construction instead and sets itself up at once.
    """

    def __init__(
        self,
        cfg: LearnerConfig,
        model_path: str,
        *,
        temperature: float,
        total_steps: int,
        rank: int,
        world_size: int,
        seed: int,
        master_addr: str | None = None,
        threads: int | None = None,
    ):
        self._args = dict(
            cfg=cfg,
            model_path=model_path,
            temperature=temperature,
            total_steps=total_steps,
            rank=rank,
            world_size=world_size,
            seed=seed,
        )
        self.worker: LearnerWorker | None = None
        self.threads = set_threads(threads)
        self._store = None  # rank 0: the process group's store, bound by node_address
        self._weight_store = None  # rank 0: the weight group's, bound by weight_group_endpoint
        if master_addr is not None:
            if world_size != 1:
                raise ValueError(
                    "master_addr at construction is for one rank; several ranks meet through node_address() and setup()"
                )
            self.setup(master_addr)

    def node_id(self) -> str:
        """The Ray node this rank runs on (the driver names it when the rank is lost)."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def node_address(self) -> tuple[str, int]:
        """Rank 0: this node's IP and the port of the process group's store, bound now."""
        import ray

        from pipeline.distributed.rendezvous import host_store

        host = ray.util.get_node_ip_address()  # 127.0.0.1 for a run on one machine (start_ray)
        self._store = host_store(_RENDEZVOUS_TIMEOUT_S, host=host)
        return host, self._store.port

    def setup(self, master_addr: str, master_port: int | None = None) -> int:
        """Join the process group (blocks until every rank has joined), build the engine."""
        from pipeline.distributed.rendezvous import host_store, join_store

        a = self._args
        if a["rank"] == 0:
            store = self._store or host_store(_RENDEZVOUS_TIMEOUT_S, host=master_addr)
        elif master_port is None:
            raise ValueError(f"learner rank {a['rank']} needs rank 0's master_port")
        else:
            store = join_store(master_addr, master_port, _RENDEZVOUS_TIMEOUT_S)
        init_process_group_env(a["rank"], a["world_size"], master_addr, store)
        self.threads = set_threads(self.threads)  # the process group setup may have reset it
        self.worker = LearnerWorker(
            a["cfg"],
            a["model_path"],
            temperature=a["temperature"],
            total_steps=a["total_steps"],
            rank=a["rank"],
            world_size=a["world_size"],
            seed=a["seed"],
        )
        self.worker.setup()
        return self.worker.version

    def train_step(self, minibatches: list[TrainBatch]) -> dict[str, float]:
        return self.worker.train_step(minibatches)

    def weight_packet(self, version: int):
        from pipeline.distributed.weight_sync import pack

        sd = self.worker.state_dict_for_sync()
        if self.worker.rank != 0:
            return None
        packet = pack(sd, version)
        self._packet_nbytes = packet.nbytes
        return packet

    def packet_nbytes(self) -> int:
        """Bytes of the last ``weight_packet`` (for the sync/bytes metric; 0 before the first)."""
        return getattr(self, "_packet_nbytes", 0)

    # ----- collective weight sync (pipeline/distributed/collective_sync.py) ----------------------------------
    def weight_group_endpoint(self, backend: str) -> tuple[str, int, str]:
        """Where the weight group meets: this node's IP (so consumers on other nodes can reach
        it), the port of its store, bound now, and the backend resolved here (``auto`` -> nccl if this learner
        sees CUDA, else gloo)."""
        import ray

        from pipeline.distributed.collective_sync import DEFAULT_TIMEOUT_S, resolve_backend
        from pipeline.distributed.rendezvous import host_store

        host = ray.util.get_node_ip_address()
        self._weight_store = host_store(DEFAULT_TIMEOUT_S, host=host)
        return host, self._weight_store.port, resolve_backend(backend)

    def sync_meta(self):
        return self.worker.sync_meta()

    def init_weight_group(self, host: str, port: int, world_size: int, backend: str, **kw):
        return self.worker.init_weight_group(host, port, world_size, backend, store=self._weight_store, **kw)

    def broadcast_weights(self, version: int):
        return self.worker.broadcast_weights(version)

    def save_checkpoint(self, ckpt_dir: str) -> None:
        self.worker.save_checkpoint(ckpt_dir)

    def load_checkpoint(self, ckpt_dir: str) -> int:
        return self.worker.load_checkpoint(ckpt_dir)

    def ping(self) -> int:
        return self.worker.version

    def hardware(self) -> dict:
        return hardware_info(self.worker.precision, self.threads)
