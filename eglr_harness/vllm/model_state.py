"""Model Runner V2's way to tell the EGLR model which request slot each row of its forward holds.

MRV2 (``vllm/v1/worker/gpu/model_runner.py``, ``execute_model``) orders a step's requests by its own rule
(``sort_batch_req_ids``: decodes first) and reaches each one's persistent slot through the step's
``idx_mapping`` (batch position -> slot). Its logits processors see that mapping only when the sampler runs,
after the forward; the forward context carries none of it. What MRV2 gives a model is a model state of its own
(``get_model_state_cls``, read by ``vllm/v1/worker/gpu/model_states/__init__.py``), whose ``prepare_inputs`` runs
before each forward and returns extra keyword arguments of the model's forward, as vLLM's encoder-decoder and
n-gram-embedding models use it. ``EglrModelState`` is vLLM's default state plus one such argument: the step's
slots, which the model looks up in the row-settings processor (``row_settings.py``).

Imported only by MRV2 (through ``EglrForCausalLMMixin.get_model_state_cls``); V1's runner never asks for it.
"""

from __future__ import annotations

from vllm.v1.worker.gpu.model_states.default import DefaultModelState

from eglr_harness.vllm.row_settings import REQUEST_SLOTS_ARG


class EglrModelState(DefaultModelState):
    """vLLM's ``DefaultModelState`` that also hands the forward ``REQUEST_SLOTS_ARG``: the step's slots."""

    def prepare_inputs(self, input_batch, req_states) -> dict:
        inputs = dict(super().prepare_inputs(input_batch, req_states))
        slots = step_slots(input_batch.req_ids, input_batch.idx_mapping_np, req_states.req_id_to_index)
        if slots is not None:
            inputs[REQUEST_SLOTS_ARG] = slots
        return inputs


def step_slots(req_ids: list[str], idx_mapping_np, req_id_to_index: dict[str, int]) -> list[int] | None:
    """The slot of each of the step's requests (MRV2's ``idx_mapping``, batch order), or None for a dummy batch.

    MRV2 calls ``prepare_inputs`` in its dummy runs too (profiling, a data-parallel rank's idle step), with made-up
    request ids and ``idx_mapping`` 0..R-1: slots that live requests may hold, whose settings (and signal tags)
    must not be applied to dummy rows. A real step's requests all hold a slot."""
    if not all(req_id in req_id_to_index for req_id in req_ids):
        return None
    return [int(slot) for slot in idx_mapping_np[:len(req_ids)]]
