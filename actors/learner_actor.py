"""The Ray shell of one learner rank (``LearnerActor``): it forms the process group, then runs the
plain ``LearnerWorker`` (``actors/learner.py``)."""

from __future__ import annotations

import inspect

from actors.learner import LearnerWorker
from actors.learner_setup import init_process_group_env
from pipeline.core.hardware import hardware_info, set_threads
from pipeline.core.types import TrainBatch

_RENDEZVOUS_TIMEOUT_S = 900.0  # ranks start as Ray places them: minutes apart on a busy cluster


class LearnerActor:
    """Ray shell of one learner rank: process-group setup, then the plain worker.

    The driver asks rank 0 for ``node_address()`` (rank 0 binds the group's store there and then),
    then calls ``setup(addr, port)`` on every rank: the ranks meet at rank 0's node wherever Ray
    placed it (several nodes need a real IP, not loopback). A single rank may be given
    ``master_addr`` at construction instead and sets itself up at once.
    """

    def __init__(self, *worker_args, master_addr: str | None = None, threads: int | None = None, **worker_kwargs):
        """``worker_args`` / ``worker_kwargs``: the ``LearnerWorker``'s own (cfg, model_path,
        temperature, total_steps, rank, world_size, seed), kept for ``setup``."""
        # Bound now, so that a wrong argument fails at construction, not in setup() on the cluster.
        bound = inspect.signature(LearnerWorker).bind(*worker_args, **worker_kwargs)
        bound.apply_defaults()
        self._args = dict(bound.arguments)
        world_size = self._args["world_size"]
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
        self.worker = LearnerWorker(**a)
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
