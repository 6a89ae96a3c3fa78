"""An effect's operation settled elsewhere: by an earlier run of the run's chain, or by another
run of its family (a fork's source, a fork, a successor) — taken as this step's outcome, its
rejection raised again, or the run blocked until the holder settles it.

``SettledElsewhere`` is a part of ``dispatch.EffectDispatch``, kept apart because it answers one
question — "did someone else of this run's kin already do this?" — that the dispatch protocol
asks before it prepares an operation and again when the store refuses its dispatch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._rules.effects import Effect
from .._rules.family import in_a_family
from .._rules.fork import Forked, forked_effect
from ..errors import EffectRejected, ReplayMismatch, SentBySource, StaleCheckpoint
from ..storage.base import Store
from ..types import EffectState, OperationRecord, StepRecord
from .flow import Flow, io

if TYPE_CHECKING:
    from .core import RunCore


class SettledElsewhere:
    """The lookups of an effect step (``EffectDispatch``) in its chain and its family."""

    __slots__ = ()

    core: RunCore
    sid: str
    effect: Effect[Any]
    family_key: str | None

    def accepted_step(self, op: OperationRecord, hashed: str) -> StepRecord:
        raise NotImplementedError  # EffectDispatch's: the step recorded for an accepted operation

    def settled_in_chain(self, op_id: str, payload_ref: str) -> Flow[OperationRecord | None]:
        """The operation as an earlier run of this chain accepted it, or None — looked up in
        place, never copied; one it rejected raises that rejection again. It stands for this
        run too, but only for the same effect and the very same payload: a changed payload is
        never sent under its key — it blocks, or under ``replan`` (as within one run) what
        happened is replayed."""
        chain_id = self.core.run.chain_id
        assert chain_id is not None  # asked only for a run that continues another
        settled = yield from io(Store.chain_operation, chain_id, op_id)
        if settled is None:
            return None
        if settled.effect != self.effect.name:
            yield from self.core.block(
                ReplayMismatch(
                    self.core.run.run_id,
                    self.sid,
                    f"operation {op_id!r} was settled by run {settled.run_id!r} of"
                    f" this chain for effect {settled.effect!r}",
                ),
                phase="replay_mismatch",
                op=settled,
            )
        if settled.payload_ref != payload_ref and not self.core.replans:
            yield from self.core.block(
                StaleCheckpoint(
                    self.core.run.run_id,
                    self.sid,
                    f"the payload of {op_id!r} changed since run"
                    f" {settled.run_id!r} of this chain settled it; it is never"
                    " sent again under its key",
                ),
                phase="stale_checkpoint",
                op=settled,
                evidence={"new_payload_ref": payload_ref, "settled_by": settled.run_id},
            )
        if settled.state is EffectState.REJECTED:
            raise EffectRejected(self.core.run.run_id, self.sid, op_id, settled.error)
        return settled

    def settled_before(
        self, op_id: str, payload_ref: str, chained: bool, hashed: str
    ) -> Flow[OperationRecord | None]:
        """The operation as another run settled it for this one — an earlier run of its chain
        (``settled_in_chain``), or a run it was forked from (``settled_in_ancestry``) — or
        None: it is this run's own to prepare."""
        core = self.core
        if op_id in core.operations:
            return None
        if chained and core.run.parent_run_id is not None:
            settled = yield from self.settled_in_chain(op_id, payload_ref)
            if settled is not None:
                return settled
        if not in_a_family(core.run):
            return None
        settled = yield from self.settled_in_ancestry(op_id, payload_ref)
        if settled is not None:
            yield from self.taken(settled, hashed)
        return settled

    def settled_in_ancestry(self, op_id: str, payload_ref: str) -> Flow[OperationRecord | None]:
        """The operation as a run this one grew from (a fork's source, …) sent and accepted it —
        its receipt stands for this run, recorded as the step's — or None: it is then this
        run's own to send (see ``_rules.fork.forked_effect``)."""
        assert self.family_key is not None
        found = yield from io(Store.family_operation, self.core.run.run_id, self.family_key)
        decided = forked_effect(found, effect=self.effect.name, payload_ref=payload_ref)
        if decided is Forked.SEND:
            return None
        assert found is not None
        return (yield from self.adopt_or_block(found, decided, op_id, payload_ref))

    def held_for_replay(self) -> Flow[OperationRecord | None]:
        """A replay, at an operation its record holds no outcome of: the operation as another
        run of the family holds its claim, or None. A resume would prepare it and learn that
        from the store's refusal to send it (``ClaimedInFamily``: the first run of a family
        learns of its forks no other way), then take the holder's outcome — and may have done
        so already, recording nothing of a rejection. A replay sends nothing, so it asks."""
        core = self.core
        assert core.replaying is not None
        if not core.replaying.family_readable or self.family_key is None:
            return None  # a run file: its family is not at hand
        found: OperationRecord | None = yield from io(
            Store.family_operation, core.run.run_id, self.family_key
        )
        return found

    def held_in_family(
        self, op_id: str, payload_ref: str, hashed: str, found: OperationRecord | None = None
    ) -> Flow[Any]:
        """The store refused to send the operation: another run of the family holds it
        (``found``, when already read). Its accepted outcome is this step's (recorded as the
        step's); a rejection stands; anything else blocks this run until the holder settles it."""
        core = self.core
        assert self.family_key is not None
        if found is None:
            found = yield from io(Store.family_operation, core.run.run_id, self.family_key)
        if found is None:  # its holder's record is gone (pruned), or it was given back meanwhile
            yield from core.block(
                SentBySource(
                    core.run.run_id,
                    self.sid,
                    op_id,
                    core.run.run_id,  # the run to fork with resend: the holder's record is gone
                    "another run of its family sent it, and its record of it is no longer there"
                    " to take the outcome from (pruned, or given back a moment ago: resume to look"
                    " again)",
                ),
                phase="forked_effect",
            )
        assert found is not None
        decided = forked_effect(found, effect=self.effect.name, payload_ref=payload_ref)
        if decided is Forked.SEND:  # held there, only prepared: it may still go out there
            decided = Forked.UNSETTLED
        settled = yield from self.adopt_or_block(found, decided, op_id, payload_ref)
        yield from self.taken(settled, hashed)
        return settled.receipt

    def taken(self, settled: OperationRecord, hashed: str) -> Flow[None]:
        """Record the step with the outcome another run of the family settled (``settled``), so
        that a replay finds it here and a fork of this run copies it."""
        core = self.core
        if core.cancelling or core.replaying is not None:  # nothing new is written
            return
        step = self.accepted_step(settled, hashed)
        yield from core.append_new(core.write(io(Store.record_step, core.claim, step)), self.sid)
        core.steps[self.sid] = step

    def adopt_or_block(
        self, found: OperationRecord, decided: Forked, op_id: str, payload_ref: str
    ) -> Flow[OperationRecord]:
        """``found``, held by another run of the family, as this run takes it (``decided``):
        accepted there with this payload, it is returned; rejected there, the rejection is
        raised again; otherwise the run blocks (``SentBySource``, ``ReplayMismatch``)."""
        core = self.core
        if decided is Forked.ADOPT:
            return found
        if decided is Forked.REJECTED:
            raise EffectRejected(core.run.run_id, self.sid, op_id, found.error)
        if decided is Forked.OTHER_EFFECT:
            yield from core.block(
                ReplayMismatch(
                    core.run.run_id,
                    self.sid,
                    f"operation {op_id!r} was sent by run {found.run_id!r} of its family, for"
                    f" effect {found.effect!r}",
                ),
                phase="replay_mismatch",
                op=found,
            )
        if decided is Forked.UNSETTLED and found.state is EffectState.PREPARED:
            # Sent there once, then found not applied: that run sends it again, under the key
            # it sent before, which alone lets the owner absorb a request of it still on its way.
            holder = yield from io(Store.get_run, found.run_id)
            if holder.status.terminal:
                reason = (
                    f"run {found.run_id!r} of its family sent it, was told it was not applied,"
                    f" and ended {holder.status.value} without sending it again"
                )
            else:
                reason = (
                    f"run {found.run_id!r} of its family sent it, was told it was not applied,"
                    f" and holds it to send again under its own key — resume {found.run_id!r},"
                    " then this run, which takes the outcome settled there"
                )
        elif decided is Forked.UNSETTLED:
            reason = (
                f"run {found.run_id!r} of its family holds it {found.state.value}: it may have"
                f" happened there — settle it in that run (`safepoint record {found.run_id}`),"
                " then resume this run, which takes the outcome settled there"
            )
        else:
            reason = f"run {found.run_id!r} of its family sent it with another payload"
        yield from core.block(
            SentBySource(core.run.run_id, self.sid, op_id, found.run_id, reason),
            phase="forked_effect",
            op=found,
            evidence={"new_payload_ref": payload_ref, "sent_by": found.run_id},
        )
        raise AssertionError("unreachable")
