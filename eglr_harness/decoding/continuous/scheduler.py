"""Which request runs in which slot of the continuous engine, and when: admission, prefill chunks, every
phase change of a row and every finish, retirement. Host bookkeeping only, no model and no tensor
(tests/decoding/test_scheduler.py runs it alone); the engine's model runner (``engine._Run``) asks it one
question, what runs now (``next_work``: a ``Prefill`` or a ``Step``), runs that forward and hands its read
back (``prefilled``, ``absorb``).

A row's life, owned here (``RowPhase``): PREFILL (admitted; its prompt goes in by chunks) -> ADVANCE (its
prompt is in: it feeds its newest token) <-> REFINE (gated: one EGLR iteration per step until its exit
emits the token) -> finished (EOS, a stop string, its length: retired, its slot free).

The policy, as vLLM's and SGLang's schedulers have one:

- **Admission.** Waiting requests go longest prompt first (lm-eval's order: memory peaks early, slots
  fill evenly). Free slots are given to waiting requests once ``admit_at`` of them can go in, or the
  batch is empty (fewer, larger prefills read the weights fewer times), and never beyond
  ``max_advancing`` rows that are not refining: the slots beyond it are headroom for refining rows.
- **Prefill chunks.** A forward takes at most ``prefill_tokens`` prompt tokens (rows x chunk length).
  Rows at their first chunk are packed together; a row further into a long prompt goes alone (its chunk
  attends to up to its whole prompt), and a row whose prompt is not done after a forward goes to the
  back of the line, so a long prompt does not hold the short ones up.
- **Shared prompts.** With ``share_prompts``, a prompt is prefilled once while a row of it is in a slot: an
  admitted request whose prompt a live row holds (prefilled, or being prefilled) is that row's follower; it
  runs no prefill forward, and the engine copies the holder's prompt K/V and prompt state into its slot once
  the holder's prompt is complete (``Prefill.copies``). Waiting requests of one prompt are kept together, so
  that the rows of a pool's prompt (every cell, cycle and seed) find their holder in a slot. When a holder
  retires, a complete follower holds the prompt in its place, or else its freed slot keeps holding it (the
  next request of that prompt takes that slot back; a request of another prompt takes it last).
- **Rounds.** Each round admits, runs one prefill forward when a prompt waits, then one decoding step when
  some row is past its prompt.
- **Retirement.** A row leaves its slot when it ends (EOS, a stop string, its length); the slot is free
  for the next admission.
- **Overlapped reads** (``overlap``, as vLLM's async scheduling): the engine launches step n + 1 before it reads
  step n's result, so the host never waits for the device in a steady step. Only for runs whose rows never refine:
  every step a row takes then emits one token, so a row's length is known without the read, and a row's step is
  launched only while it may still emit (its tokens plus its step in flight below its ``max_new_tokens``); a row
  leaves its slot when its last step is launched, so the next round admits into it as soon as it would without
  overlap. A row that ended by EOS or a stop string at step n is known to have ended only when step n's read comes
  in, after step n + 1 was launched with it: that step's result for it is discarded (``absorb``'s ``step``), and
  its slot is free one step later than without overlap. When no step can be launched while one is in flight
  (every row's last step launched, or the end of the run), the work is a ``Drain``: the read of the step in
  flight comes in.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from eglr_harness.decoding.continuous.step_state import READ_FIELDS, RowPhase
from eglr_harness.decoding.contract import Outcome, Request

_F = {name: i for i, name in enumerate(READ_FIELDS)}


@dataclass
class Row:
    """A request in a slot. position: its last position whose key/value is in the slot (the host's mirror
    of the device's); prefilled: its prompt positions in the slot so far."""

    request: Request
    outcome: Outcome
    index: int  # of the request
    position: int
    phase: RowPhase = RowPhase.PREFILL
    prefilled: int = 0
    source: int | None = None  # the slot whose prompt K/V it copies instead of a prefill (shared prompts)
    in_flight: int = 0  # overlapped reads: its steps launched whose read has not come in

    @property
    def prompt_left(self) -> int:
        return len(self.request.prompt) - self.prefilled


@dataclass(frozen=True)
class Prefill:
    """A prefill forward: the next chunk (``chunk`` positions) of the prompts of ``slots``; ``admitted``: the
    slots filled since the last work (their requests' settings go into the slot state first); ``copies``:
    (source slot, follower slot) pairs whose source's prompt is complete after this forward: the follower gets
    the source's prompt K/V and prompt state instead of a forward of its own (``slots`` may then be empty)."""

    admitted: list[int]
    slots: list[int]
    chunk: int
    copies: list[tuple[int, int]] = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class Step:
    """A decoding step: the ``advancing`` slots feed their newest token, the ``refining`` ones run one iteration.
    ``rows``: the row of each slot (advancing, then refining) when the step was made: with overlapped reads a slot
    may hold another row by the time the step's read comes in (``absorb``)."""

    advancing: list[int]
    refining: list[int]
    rows: tuple[Row, ...] = dataclasses.field(default=(), compare=False, repr=False)


@dataclass(frozen=True)
class Drain:
    """Overlapped reads: no step can be launched now and one is in flight (every running row's last step is, or
    no row runs any more): its read comes in (``absorb`` with its ``step``) before anything else runs."""


class Scheduler:
    """The slots of one run and the requests waiting for them.

    requests, outcomes: the run's, in request order. num_slots: rows that can run at once (advancing and
    refining); max_advancing: rows that may advance together; admit_at: admit once this many can go in
    (or the batch is empty); prefill_tokens: the most prompt tokens one prefill forward takes; share_prompts:
    prefill a prompt once while a row of it is in a slot (the policy's "shared prompts"); overlap: the engine reads
    a step's result after it launched the next step (the policy's "overlapped reads"; ``ValueError`` when a request
    refines).
    """

    def __init__(self, requests: Sequence[Request], outcomes: Sequence[Outcome], *, num_slots: int,
                 max_advancing: int, admit_at: int, prefill_tokens: int, share_prompts: bool = False,
                 overlap: bool = False):
        if overlap and any(r.config.refines for r in requests):
            raise ValueError("`overlap`=True with a request that refines is not allowed; allowed: overlapped reads "
                             "for runs whose rows never refine (a gate's decision shapes the next step).")
        self.overlap = overlap
        self.in_flight: deque[Step] = deque()  # overlapped reads: steps launched whose read has not come in
        self.requests, self.outcomes = requests, outcomes
        self.num_slots, self.max_advancing = num_slots, max_advancing
        self.admit_at, self.prefill_tokens = admit_at, prefill_tokens
        self.share_prompts = share_prompts
        self.waiting = deque(sorted(range(len(requests)), key=self._admission_order()))
        self.rows: list[Row | None] = [None] * num_slots
        self.prefilling: deque[int] = deque()  # slots whose prompt is not all in the K/V yet, in admission order
        # shared prompts: prompt -> the slot whose K/V holds it (a live row's, or a freed slot's until reused)
        self.holders: dict[tuple[int, ...], int] = {}
        self.copying: list[int] = []  # followers waiting for their holder's prompt to be complete
        self._prefill_next = True  # where the round is: its admission and prefill next, else its step

    def _admission_order(self) -> Callable[[int], tuple[int, int]]:
        """Longest prompt first; with shared prompts, the requests of one prompt together (at its first
        request's place), so that they are admitted while its holder is in a slot."""
        first: dict[tuple[int, ...], int] = {}
        for i, request in enumerate(self.requests):
            first.setdefault(request.prompt, i)
        if self.share_prompts:
            return lambda i: (-len(self.requests[i].prompt), first[self.requests[i].prompt])
        return lambda i: (-len(self.requests[i].prompt), 0)

    # ---------------------------------------------------------------- the one question
    def next_work(self) -> Prefill | Step | None:
        """What runs now (None: every request has finished). A round admits, prefills one chunk when a prompt
        waits (and copies the prompts that are complete to their followers), then steps when some row is past
        its prompt (the rows a prefill just completed included); with overlapped reads, a ``Drain`` when no row
        can step and a step is in flight."""
        while self.busy():
            if self._prefill_next:
                self._prefill_next = False
                admitted = self.admit()
                slots, chunk = self.next_chunk() if self.prefilling else ([], 0)
                copies = self.ready_copies(slots, chunk)
                if slots or copies:
                    return Prefill(admitted, slots, chunk, copies)
            else:
                self._prefill_next = True
                advancing = [s for s in self.slots_in(RowPhase.ADVANCE) if self._may_emit(self.rows[s])]
                refining = self.slots_in(RowPhase.REFINE)
                if advancing or refining:
                    step = Step(advancing, refining, tuple(self.rows[s] for s in advancing + refining))
                    if self.overlap:
                        self.in_flight.append(step)
                        for slot, row in zip(advancing + refining, step.rows):
                            row.in_flight += 1
                            if not self._may_emit(row):  # its last step: its slot is free for the next round
                                self.retire(slot)
                    return step
                if self.in_flight:
                    return Drain()
        return None

    # ---------------------------------------------------------------- what runs
    def busy(self) -> bool:
        return bool(self.waiting) or any(self.rows) or bool(self.in_flight)

    @staticmethod
    def _may_emit(row: Row) -> bool:
        """Whether another step of ``row`` may emit a token: below its length counting its steps in flight (each
        emits one: overlapped reads run rows that never refine)."""
        return len(row.outcome.tokens) + row.in_flight < row.request.max_new_tokens

    def slots_in(self, phase: RowPhase) -> list[int]:
        return [s for s, row in enumerate(self.rows) if row is not None and row.phase == phase]

    def decoding(self) -> bool:
        """Whether some row is past its prompt (a decoding step has work)."""
        return any(row is not None and row.phase != RowPhase.PREFILL for row in self.rows)

    # ---------------------------------------------------------------- admission
    def admit(self) -> list[int]:
        """Give free slots to waiting requests, as the policy allows; returns the slots filled (their rows
        wait for their prefill)."""
        free = [s for s, row in enumerate(self.rows) if row is None]
        advancing = sum(1 for row in self.rows if row is not None and row.phase != RowPhase.REFINE)
        admit = min(len(free), self.max_advancing - advancing, len(self.waiting))
        if admit <= 0 or (admit < min(self.admit_at, len(self.waiting)) and len(free) < self.num_slots):
            return []
        kept = set(self.holders.values())  # shared prompts: slots whose K/V holds a prompt, live or freed
        free.sort(key=lambda slot: slot in kept)  # a freed slot that keeps a prompt is given away last
        slots = []
        for _ in range(admit):
            index = self.waiting.popleft()
            request = self.requests[index]
            holder = self.holders.get(request.prompt)
            slot = holder if holder in free else free[0]  # a freed slot that keeps this prompt takes it back
            free.remove(slot)
            slots.append(slot)
            row = self.rows[slot] = Row(request, self.outcomes[index], index, position=len(request.prompt) - 1)
            if slot != holder:
                self._forget_prompts_in(slot)  # its prefill or copy overwrites the prompt a freed slot kept
            if holder is None:
                self.prefilling.append(slot)
                if self.share_prompts:
                    self.holders[request.prompt] = slot
            else:
                row.source = holder
                self.copying.append(slot)
        return slots

    def _forget_prompts_in(self, slot: int) -> None:
        """``slot`` is given to a request of another prompt: a prompt its freed K/V kept is no longer held."""
        for prompt in [prompt for prompt, holder in self.holders.items() if holder == slot]:
            del self.holders[prompt]

    # ---------------------------------------------------------------- prefill
    def next_chunk(self) -> tuple[list[int], int]:
        """The prefilling slots of the next prefill forward and its chunk length Q (see the policy)."""
        first = self.rows[self.prefilling[0]]
        chunk = min(first.prompt_left, self.prefill_tokens)
        chosen = [self.prefilling[0]]
        if first.prefilled == 0:
            for slot in list(self.prefilling)[1:]:
                if self.rows[slot].prefilled or (len(chosen) + 1) * chunk > self.prefill_tokens:
                    break
                chosen.append(slot)
        return chosen, chunk

    def ready_copies(self, slots: list[int], chunk: int) -> list[tuple[int, int]]:
        """The (source, follower) pairs whose source's prompt is complete once the prefill of ``slots`` by
        ``chunk`` positions has run; they leave the followers' line."""
        def complete(source: int) -> bool:
            row = self.rows[source]
            # a row's own slot kept the prompt (source is itself), or it is past its prompt, or will be
            return (row.source == source or row.phase != RowPhase.PREFILL
                    or (source in slots and row.prompt_left <= chunk))

        ready = [slot for slot in self.copying if complete(self.rows[slot].source)]
        self.copying = [slot for slot in self.copying if slot not in ready]
        return [(self.rows[slot].source, slot) for slot in ready]

    def copied(self, followers: list[int]) -> list[int]:
        """After their prompt K/V and state were copied in: ``followers`` are past their prompt (they advance
        next, as rows whose prefill completed do)."""
        for slot in followers:
            row = self.rows[slot]
            row.prefilled, row.phase = len(row.request.prompt), RowPhase.ADVANCE
        return followers

    def prefilled(self, slots: list[int], takes: list[int]) -> list[int]:
        """After a prefill forward that took ``takes`` prompt positions of ``slots``: the slots whose prompt is
        now complete (they advance next); the others go to the back of the line."""
        done = []
        for slot, take in zip(slots, takes):
            row = self.rows[slot]
            row.prefilled += take
            self.prefilling.remove(slot)
            if row.prompt_left == 0:
                row.phase = RowPhase.ADVANCE
                done.append(slot)
            else:
                self.prefilling.append(slot)
        return done

    # ---------------------------------------------------------------- after a forward
    def absorb(self, read: Sequence[Sequence[float]], slots: list[int], *, eos: frozenset[int],
               stopped: Callable[[list[Row]], set[int]], on_emitted: Callable[[int], None] | None = None,
               step: Step | None = None) -> list[Row]:
        """Apply a forward's read (one row of ``READ_FIELDS`` values per slot of ``slots``, rows past their
        prompt) to the rows' outcomes: the phase changes (ADVANCE -> REFINE when gated, REFINE -> ADVANCE when
        its exit emits) and the finishes (``eos`` tokens, a stop string: ``stopped(rows)`` -> ids of the rows
        whose text now ends with one, the length). Finished rows are retired; returns them in slot order.
        ``on_emitted(n)`` hears how many tokens the read emitted (progress that moves with tokens).
        step: the decoding step whose read this is (``slots`` its advancing then refining slots); with overlapped
        reads the oldest step in flight, and a row of it that has finished since it was launched is skipped: its
        result is discarded."""
        rows = step.rows if step is not None and step.rows else [self.rows[slot] for slot in slots]
        if step is not None and self.overlap:
            assert self.in_flight and self.in_flight[0] is step, "overlapped reads come in in launch order"
            self.in_flight.popleft()
            for row in rows:
                row.in_flight -= 1
        emitted: list[tuple[int, Row]] = []
        for slot, row, values in zip(slots, rows, read):
            phase, outcome = row.phase, row.outcome
            if outcome.finish:
                continue  # ended at an earlier step whose read came in after this step was launched: discarded
            if phase == RowPhase.ADVANCE:
                outcome.entropies.append(values[_F["entropy"]])
                if values[_F["gated"]]:
                    row.phase = RowPhase.REFINE
                    outcome.gated += 1
                    continue
            if not values[_F["emitted"]]:
                continue  # KL still above the exit threshold: another iteration next step
            k = int(values[_F["iterations"]])
            if phase == RowPhase.REFINE:
                outcome.iterations[k] += 1
                row.phase = RowPhase.ADVANCE
            outcome.tokens.append(int(values[_F["token"]]))
            outcome.logprobs.append(values[_F["logprob"]])
            outcome.final_kls.append(values[_F["kl"]])
            outcome.token_iterations.append(k)
            emitted.append((slot, row))
        if on_emitted is not None:
            on_emitted(len(emitted))
        hits = stopped([row for _, row in emitted if row.request.stop_strings])
        finished = []
        for slot, row in emitted:
            outcome = row.outcome
            if outcome.tokens[-1] in eos:
                outcome.finish = "eos"
            elif id(row) in hits:
                outcome.finish = "stop"
            elif len(outcome.tokens) >= row.request.max_new_tokens:
                outcome.finish = "length"
            if outcome.finish:
                # a row whose last step was in flight left its slot when that step was launched
                finished.append(self.retire(slot) if self.rows[slot] is row else row)
        return finished

    def retire(self, slot: int) -> Row:
        """Free ``slot``; returns the row that ran there. A holder of a shared prompt hands it to a row of the
        same prompt whose K/V is complete, if one is in a slot (a holder retires only past its prompt, after its
        followers of the round were copied); else the freed slot keeps holding it until it is given to a request
        of another prompt (``admit``)."""
        row, self.rows[slot] = self.rows[slot], None
        prompt = row.request.prompt
        if self.holders.get(prompt) == slot:
            heirs = (s for s, other in enumerate(self.rows)
                     if other is not None and other.phase != RowPhase.PREFILL and other.request.prompt == prompt)
            self.holders[prompt] = next(heirs, slot)
        return row
