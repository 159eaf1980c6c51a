"""Our vLLM worker extension: verl's colocated one, plus the run guard's weight-sync receipts.

vLLM mixes `worker_extension_cls` into every worker process that holds a model shard; verl names its own
(`vLLMColocateWorkerExtension`: the IPC weight sync, LoRA, FP8) and lets `rollout.engine_kwargs.vllm` override
that argument, which is how ours is put in (rl_factory/backends/verl/config.py) without touching verl. It is
verl's class with two methods wrapped: `update_weights_from_ipc` (one whole sync) fingerprints the weights the
worker holds before and after, and `_update_weights` (one bucket) the tensors it was sent, for
rl_factory/guard/syncs.py. Everything else is verl's. Imported only inside vLLM's workers (it needs vLLM).
"""
from __future__ import annotations

import os

from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

from rl_factory.guard.syncs import SYNCS_ENV, SyncRecorder


class ReceiptsWorkerExtension(vLLMColocateWorkerExtension):
    def _rlf_recorder(self) -> SyncRecorder:
        recorder = getattr(self, "_rlf_syncs", None)
        if recorder is None:
            recorder = self._rlf_syncs = SyncRecorder(os.environ.get(SYNCS_ENV))
        return recorder

    def update_weights_from_ipc(self, peft_config: dict = None, base_sync_done=False, use_shm: bool = False):
        recorder = self._rlf_recorder()
        recorder.begin(self.model_runner.model)
        result = super().update_weights_from_ipc(peft_config=peft_config, base_sync_done=base_sync_done,
                                                 use_shm=use_shm)
        recorder.end(self.model_runner.model, adapter=bool(peft_config and base_sync_done),
                     replica=os.environ.get("VERL_REPLICA_RANK", "0"), rank=int(getattr(self, "rank", 0) or 0))
        return result

    def _update_weights(self, weights, peft_config: dict, base_sync_done: bool):
        self._rlf_recorder().received(t for _, t in weights)
        return super()._update_weights(weights, peft_config=peft_config, base_sync_done=base_sync_done)
