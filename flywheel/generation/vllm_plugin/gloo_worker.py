"""The server side of the gloo engine: a vLLM `WeightTransferEngine` that receives the trainer's
weights over gloo into memory and loads them only when every tensor has arrived.

vLLM's worker drives it through the weight-transfer routes: /init_weight_transfer_engine joins
the trainer's group; /start_weight_update opens a sync; each /update_weights receives the
tensors it names, in order; /finish_weight_update checks that the sync is complete and loads
it through vLLM's in-place reload (the loader the disk path's `reload_weights` uses, fed from
memory instead of a folder). A transfer that breaks off (the trainer died, a tensor of the
wrong shape, a sync finished before its tensors came) raises, and the served weights stay the
previous version: a partial sync never reaches the model. The cost: the server holds one copy
of the incoming weights until the sync is complete.

Runs inside vLLM (imported lazily by the factory `register` fills); needs vllm.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.distributed.weight_transfer.base import WeightTransferEngine

from flywheel.generation.vllm_plugin.gloo import DTYPES, GlooInitInfo, GlooUpdateInfo, broadcast, open_group


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """Receives weights from the trainer (rank 0) over a gloo group; see the module docstring."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group = None
        self.received: dict[str, torch.Tensor] | None = None  # None: no sync open
        self.expected: list[str] = []

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        self.shutdown()  # a new trainer (or a restarted one) replaces the old group
        rank = init_info.rank_offset + self.parallel_config.data_parallel_index * self.parallel_config.world_size \
            + self.parallel_config.rank
        self.group = open_group(init_info.master_address, init_info.master_port, rank, init_info.world_size,
                                init_info.timeout_s)

    def start_weight_update(self) -> None:
        self.received, self.expected = {}, []

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class ends with torch.accelerator.synchronize(), which has nothing to
        # wait for here: gloo's broadcast is done when `wait` returns.
        try:
            parsed = self.parse_update_info(update_info)
        except ValueError:
            self.received = None  # a payload that is not a sync's (the trainer abandoning one) voids it
            raise
        self.receive_weights(parsed)

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("gloo weight transfer: no group; call /init_weight_transfer_engine first")
        if self.received is None:
            raise RuntimeError("gloo weight transfer: /update_weights outside a sync; call /start_weight_update first")
        self.expected += update_info.names
        try:
            for name, dtype, shape in zip(update_info.names, update_info.dtype_names, update_info.shapes):
                tensor = torch.empty(shape, dtype=DTYPES[dtype])
                broadcast(self.group, tensor)
                self.received[name] = tensor
        except BaseException:
            self.received = None  # the sync is void; the model keeps the previous weights
            self.shutdown()  # a broken gloo group cannot be reused: the trainer opens a new one
            raise

    def finish_weight_update(self) -> None:
        received, self.received = self.received, None
        if received is None:
            raise RuntimeError("gloo weight transfer: the sync broke off or was never started; the model keeps "
                               "the previous weights")
        missing = [n for n in self.expected if n not in received]
        if missing or not received:
            raise RuntimeError(f"gloo weight transfer: {len(missing)} of {len(self.expected)} tensors missing "
                               f"(first: {missing[:3]}); the model keeps the previous weights")
        from vllm.model_executor.model_loader.reload.inplace import reload_weights

        reload_weights(self.vllm_config, self.model, weights_iterator=iter(received.items()), weights_path=None,
                       is_checkpoint_format=True)

    def shutdown(self) -> None:
        group, self.group = self.group, None
        if group is not None:
            try:
                group.abort()
            except Exception:  # already broken; dropping the reference closes its sockets
                pass
