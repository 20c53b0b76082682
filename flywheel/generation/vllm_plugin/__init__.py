"""flywheel's vLLM plugin: the `gloo` weight-transfer engine, registered with vLLM's own factories.

vLLM calls `register` in every one of its processes (API server, engine core, workers) through
the `vllm.general_plugins` entry point this project ships (pyproject.toml), once flywheel is
installed in the servers' environment (`pip install --no-deps -e .` there). After that a server
started with `--weight-transfer-config '{"backend": "gloo"}'` takes weights over a gloo process
group through vLLM's routes (/init_weight_transfer_engine, /start_weight_update,
/update_weights, /finish_weight_update): the CPU counterpart of vLLM's `nccl` engine, which
lets the weight-transfer path run, and be tested, on machines without a GPU.

Standard library only at import: the engines load lazily, by module path, when vLLM or the
trainer asks for the backend.
"""

from __future__ import annotations

PLUGIN_GROUP = "vllm.general_plugins"
"""The entry-point group vLLM loads its general plugins from."""
BACKEND = "gloo"
"""The name the engine is registered under, the value of
--data.generator.init_args.weight_transfer and of the servers' --weight-transfer-config."""


def register() -> None:
    """Register the gloo engine with vLLM's worker- and trainer-side factories (idempotent:
    vLLM may call a plugin more than once per process)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, "flywheel.generation.vllm_plugin.gloo_worker",
                                                    "GlooWeightTransferEngine")
    if BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(BACKEND, "flywheel.generation.vllm.transfer",
                                                     "GlooTrainerWeightTransferEngine")
