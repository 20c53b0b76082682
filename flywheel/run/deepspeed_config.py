"""DeepSpeed configs checked before a run starts: DeepSpeed itself ignores keys it does not
know, so "zero_optimisation" (or "stage: 2" one level too high) silently trains without ZeRO.

`check_deepspeed_config(config)` walks the dict against the documented DeepSpeed keys and
raises on the first unknown one with its path, the closest known keys and the way out.
Sections whose contents DeepSpeed passes on to other code (optimizer / scheduler `params`,
monitoring back-ends) are checked one level deep only. Pure: no deepspeed import.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, Mapping

_OFFLOAD_PARAM = {"device", "nvme_path", "pin_memory", "buffer_count", "buffer_size", "max_in_cpu"}
_OFFLOAD_OPTIMIZER = {"device", "nvme_path", "pin_memory", "ratio", "buffer_count", "fast_init"}
_ZERO = {
    "stage", "allgather_partitions", "allgather_bucket_size", "overlap_comm", "reduce_scatter", "reduce_bucket_size",
    "contiguous_gradients", "load_from_fp32_weights", "grad_hooks", "round_robin_gradients", "offload_param",
    "offload_optimizer", "stage3_max_live_parameters", "stage3_max_reuse_distance", "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold", "sub_group_size", "elastic_checkpoint", "stage3_gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save", "ignore_unused_parameters", "legacy_stage1", "zero_hpz_partition_size",
    "zero_quantized_weights", "zero_quantized_nontrainable_weights", "zero_quantized_gradients", "memory_efficient_linear",
    "mics_shard_size", "mics_hierarchical_params_gather", "use_multi_rank_bucket_allreduce", "cpu_offload",
    "cpu_offload_params", "cpu_offload_use_pin_memory", "module_granularity_threshold", "use_all_reduce_for_fetch_params",
    "stage3_use_all_reduce_for_fetch_params", "prefetch_bucket_size", "param_persistence_threshold",
    "model_persistence_threshold", "max_live_parameters", "max_reuse_distance", "gather_16bit_weights_on_model_save",
    "log_trace_cache_warnings", "pipeline_loading_checkpoint", "override_module_apply",
}
_FP16 = {"enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
         "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads"}
_ACTIVATION = {"partition_activations", "cpu_checkpointing", "contiguous_memory_optimization", "number_checkpoints",
               "synchronize_checkpoint_boundary", "profile"}
SCHEMA: dict[str, Any] = {
    "train_batch_size": None, "train_micro_batch_size_per_gpu": None, "gradient_accumulation_steps": None,
    "optimizer": {"type": None, "params": "any", "legacy_fusion": None},
    "scheduler": {"type": None, "params": "any"},
    "communication_data_type": None, "prescale_gradients": None, "gradient_predivide_factor": None,
    "sparse_gradients": None, "gradient_clipping": None, "steps_per_print": None, "wall_clock_breakdown": None,
    "dump_state": None, "memory_breakdown": None, "zero_allow_untested_optimizer": None,
    "zero_force_ds_cpu_optimizer": None, "seq_parallel_communication_data_type": None, "graph_harvesting": None,
    "fp16": dict.fromkeys(_FP16),
    "bf16": {"enabled": None, "immediate_grad_update": None, "check_grad_overflow": None},
    "amp": "any",
    "zero_optimization": {**dict.fromkeys(_ZERO), "offload_param": dict.fromkeys(_OFFLOAD_PARAM),
                          "offload_optimizer": dict.fromkeys(_OFFLOAD_OPTIMIZER)},
    "activation_checkpointing": dict.fromkeys(_ACTIVATION),
    "data_types": {"grad_accum_dtype": None},
    "checkpoint": {"tag_validation": None, "load_universal": None, "use_node_local_storage": None, "parallel_write": "any"},
    "aio": "any", "flops_profiler": "any", "tensorboard": "any", "wandb": "any", "csv_monitor": "any",
    "comet": "any", "comms_logger": "any", "elasticity": "any", "autotuning": "any", "compression_training": "any",
    "pipeline": "any", "data_efficiency": "any", "curriculum_learning": "any", "weight_quantization": "any",
    "nebula": "any", "compile": "any", "timers": "any", "hybrid_engine": "any", "zero_optimization_stage": None,
}


class DeepSpeedConfigError(ValueError):
    """A key DeepSpeed would silently ignore, or a config that cannot be read."""


def check_deepspeed_config(config: Mapping[str, Any] | str | Path, where: str = "the DeepSpeed config") -> dict[str, Any]:
    """Return the config (read from a JSON file when given a path) after checking every key."""
    if isinstance(config, (str, Path)):
        where = str(config)
        try:
            config = json.loads(Path(config).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise DeepSpeedConfigError(f"{where}: cannot read it as JSON ({err})") from None
    if not isinstance(config, Mapping):
        raise DeepSpeedConfigError(f"{where}: a DeepSpeed config is a JSON object, got {type(config).__name__}")
    _walk(config, SCHEMA, [], where)
    stage = (config.get("zero_optimization") or {}).get("stage", 0)
    if stage not in (0, 1, 2, 3, "auto"):
        raise DeepSpeedConfigError(f"{where}: zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}")
    return dict(config)


def _walk(config: Mapping[str, Any], schema: Mapping[str, Any], path: list[str], where: str) -> None:
    for key, value in config.items():
        if key not in schema:
            here = ".".join([*path, key])
            close = difflib.get_close_matches(key, list(schema), n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(repr('.'.join([*path, c])) for c in close)}?" if close else ""
            raise DeepSpeedConfigError(
                f"{where}: unknown key {here!r}{hint} DeepSpeed would ignore it silently. Fix the spelling, or "
                f"remove it (known keys here: {', '.join(sorted(schema)[:12])}{', ...' if len(schema) > 12 else ''})"
            )
        sub = schema[key]
        if isinstance(sub, Mapping):
            if not isinstance(value, Mapping):
                raise DeepSpeedConfigError(f"{where}: {'.'.join([*path, key])!r} must be an object, got {value!r}")
            _walk(value, sub, [*path, key], where)
