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
    """A decoding step: the ``advancing`` slots feed their newest token, the ``refining`` ones run one iteration."""

    advancing: list[int]
    refining: list[int]


class Scheduler:
    """The slots of one run and the requests waiting for them.

    requests, outcomes: the run's, in request order. num_slots: rows that can run at once (advancing and
    refining); max_advancing: rows that may advance together; admit_at: admit once this many can go in
    (or the batch is empty); prefill_tokens: the most prompt tokens one prefill forward takes; share_prompts:
    prefill a prompt once while a row of it is in a slot (the policy's "shared prompts").
    """

    def __init__(self, requests: Sequence[Request], outcomes: Sequence[Outcome], *, num_slots: int,
                 max_advancing: int, admit_at: int, prefill_tokens: int, share_prompts: bool = False):
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
        its prompt (the rows a prefill just completed included)."""
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
                if self.decoding():
                    return Step(self.slots_in(RowPhase.ADVANCE), self.slots_in(RowPhase.REFINE))
        return None

    # ---------------------------------------------------------------- what runs
    def busy(self) -> bool:
        return bool(self.waiting) or any(self.rows)

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
               stopped: Callable[[list[Row]], set[int]],
               on_emitted: Callable[[int], None] | None = None) -> list[Row]:
        """Apply a forward's read (one row of ``READ_FIELDS`` values per slot of ``slots``, rows past their
        prompt) to the rows' outcomes: the phase changes (ADVANCE -> REFINE when gated, REFINE -> ADVANCE when
        its exit emits) and the finishes (``eos`` tokens, a stop string: ``stopped(rows)`` -> ids of the rows
        whose text now ends with one, the length). Finished rows are retired; returns them in slot order.
        ``on_emitted(n)`` hears how many tokens the read emitted (progress that moves with tokens)."""
        emitted: list[tuple[int, Row]] = []
        for slot, values in zip(slots, read):
            row = self.rows[slot]
            phase, outcome = row.phase, row.outcome
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
                finished.append(self.retire(slot))
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
