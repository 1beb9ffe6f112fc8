"""Weight sync benchmark: Ray object store vs bucketed gloo broadcast (pipeline/distributed/collective_sync.py).

    python scripts/bench/weight_sync.py [--model smollm2_135m] [--dtype fp32|bf16]
                                        [--receivers 2] [--buckets-mb 1,16,64,256,1024]
                                        [--repeats 3]

One sender actor holds the model's state dict (SmolLM2-135M from the cache, else random tensors
of its shapes) and ``--receivers`` receiver actors take it, each route doing what the pipeline
does: object store = the learner copies the state dict and packs it (checksum), consumers get
the packet and ``verify`` it; collective = ``broadcast_state_dict`` / ``receive_state_dict``
(fresh dict, trailer check). Times are end to end from the driver (median of ``--repeats``, after
one warm-up). Prints a table and one JSON object; ratio = object store seconds / collective
seconds. ``--out DIR`` stores a result folder. Timings on a shared 2-core machine are noisy: run it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import ray
import torch

from lab.bench import Bench, add_out
from lab.random_model import smollm2_config


def load_state_dict(model: str, dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], str]:
    from transformers import AutoModelForCausalLM

    try:
        from pipeline.models import resolve_model

        m = AutoModelForCausalLM.from_pretrained(str(resolve_model(model)), dtype=torch.float32)
        source = f"{model} (cached weights)"
    except Exception as e:  # not cached / no network: same shapes, random values
        m = AutoModelForCausalLM.from_config(smollm2_config())
        source = f"random tensors of SmolLM2-135M's shapes ({type(e).__name__})"
    from pipeline.distributed.weight_sync import without_aliases

    # Like the learner's state_dict_for_sync: each storage once (the tied LM head not sent twice).
    return {k: v.detach().to(dtype).clone() for k, v in without_aliases(m.state_dict()).items()}, source


@ray.remote(num_cpus=0)
class Sender:
    def __init__(self, model: str, dtype: str):
        self.sd, self.source = load_state_dict(model, getattr(torch, dtype))

    def info(self):
        from pipeline.distributed.collective_sync import meta_of

        nbytes = sum(t.numel() * t.element_size() for t in self.sd.values())
        return meta_of(self.sd), nbytes, len(self.sd), self.source

    def packet(self, version: int):
        from pipeline.distributed.weight_sync import pack

        # state_dict_for_sync() hands out a copy; pack() adds the checksum.
        return pack({k: v.clone() for k, v in self.sd.items()}, version)

    def endpoint(self) -> int:
        from pipeline.distributed.rendezvous import host_store

        self.store = host_store(300.0)
        return self.store.port

    def join(self, world: int) -> None:
        from pipeline.distributed.collective_sync import init_group

        self.group = init_group("127.0.0.1", self.store.port, 0, world, "gloo", timeout_s=300, tcp=self.store)

    def broadcast(self, version: int, bucket_bytes: int) -> dict:
        from pipeline.distributed.collective_sync import broadcast_state_dict

        return broadcast_state_dict(self.group, self.sd, version, bucket_bytes)


@ray.remote(num_cpus=0)
class Receiver:
    def set_weights(self, packet) -> int:
        from pipeline.distributed.weight_sync import verify

        verify(packet)
        self.pending = packet.state_dict
        return packet.version

    def join(self, port: int, rank: int, world: int, meta) -> None:
        from pipeline.distributed.collective_sync import init_group

        self.group, self.meta = init_group("127.0.0.1", port, rank, world, "gloo", timeout_s=300), meta

    def receive(self, version: int, bucket_bytes: int) -> int:
        from pipeline.distributed.collective_sync import receive_state_dict

        self.pending = receive_state_dict(self.group, self.meta, version, bucket_bytes)
        return version


def timed(fn, repeats: int) -> tuple[float, list]:
    fn(0)  # warm-up (first allocation, connection set-up)
    times, results = [], []
    for i in range(repeats):
        t0 = time.perf_counter()
        results.append(fn(i + 1))
        times.append(time.perf_counter() - t0)
    return statistics.median(times), results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2_135m")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--receivers", type=int, default=2)
    ap.add_argument("--buckets-mb", default="1,16,64,256,1024")
    ap.add_argument("--repeats", type=int, default=3)
    add_out(ap)
    args = ap.parse_args()
    bench = Bench.start(args.out)  # the code measured, read before it runs
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ray.init(
        address="local",
        num_cpus=os.cpu_count(),
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1"}},
    )
    try:
        sender = Sender.remote(args.model, args.dtype)
        receivers = [Receiver.remote() for _ in range(args.receivers)]
        meta, nbytes, n_tensors, source = ray.get(sender.info.remote(), timeout=600)
        out = {
            "model": source,
            "dtype": args.dtype,
            "tensors": n_tensors,
            "bytes": nbytes,
            "receivers": args.receivers,
            "repeats": args.repeats,
            "cpus": os.cpu_count(),
        }

        def object_store(v):
            ref = sender.packet.remote(v)
            return ray.get([r.set_weights.remote(ref) for r in receivers], timeout=600)

        out["object_store_s"], _ = timed(object_store, args.repeats)

        world = 1 + len(receivers)
        port = ray.get(sender.endpoint.remote(), timeout=600)
        ray.get(
            [sender.join.remote(world)] + [r.join.remote(port, i + 1, world, meta) for i, r in enumerate(receivers)],
            timeout=600,
        )
        out["collective"] = {}
        for mb in [int(x) for x in args.buckets_mb.split(",")]:
            bb = mb << 20

            def collective(v, bb=bb):
                refs = [sender.broadcast.remote(v, bb)] + [r.receive.remote(v, bb) for r in receivers]
                return ray.get(refs, timeout=600)[0]

            s, stats = timed(collective, args.repeats)
            out["collective"][mb] = {
                "seconds": s,
                "buckets": int(stats[0]["buckets"]),
                "sender_seconds": statistics.median(x["seconds"] for x in stats),
                "sender_gbps": statistics.median(x["gbps"] for x in stats),
                "object_store_over_collective": out["object_store_s"] / s,
            }
    finally:
        ray.shutdown()

    print(
        f"{out['model']}, {out['dtype']}: {n_tensors} tensors, {nbytes / 2**20:.0f} MiB, "
        f"{args.receivers} receivers, {os.cpu_count()} CPUs (median of {args.repeats})"
    )
    print(f"  object store            {out['object_store_s']:7.3f} s")
    for mb, r in out["collective"].items():
        print(
            f"  gloo, {mb:5d} MiB buckets ({r['buckets']:3d}) {r['seconds']:7.3f} s   "
            f"sender {r['sender_seconds']:.3f} s = {r['sender_gbps']:.2f} GB/s   "
            f"object store / this = {r['object_store_over_collective']:.2f}x"
        )
    print(json.dumps(out, default=float))
    rows = [
        {"route": "object store", "buckets": "", "seconds": f"{out['object_store_s']:.3f}", "vs object store": "1.00x"}
    ]
    rows += [
        {
            "route": f"gloo broadcast, {mb} MiB buckets",
            "buckets": r["buckets"],
            "seconds": f"{r['seconds']:.3f}",
            "vs object store": f"{r['object_store_over_collective']:.2f}x",
        }
        for mb, r in out["collective"].items()
    ]
    report = {"command": bench.command, **json.loads(json.dumps(out, default=float))}
    workload = [f"model={args.model}", f"dtype={args.dtype}", f"receivers={args.receivers}", f"repeats={args.repeats}"]
    bench.store(report, rows, workload)


if __name__ == "__main__":
    main()
