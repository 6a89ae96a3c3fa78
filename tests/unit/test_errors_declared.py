"""Every public error is declared once and crosses a process boundary whole: it pickles (and
copies) back to an error of its class with equal fields, message and args — the kill harness
and workers in other processes rely on it — and its fields are the constructor's parameters."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from safepoint import errors
from safepoint.errors import (
    ApprovalInvalid,
    ApprovalRefused,
    ArtifactCorrupt,
    ArtifactMissing,
    AwaitingApproval,
    AwaitingMessage,
    BudgetExhausted,
    Cancelled,
    ClaimedInFamily,
    ContinueAsNew,
    CorruptRecord,
    DeadlineExceeded,
    DecryptionFailed,
    EffectRejected,
    ForkRefused,
    GateApproved,
    HistoryLimitReached,
    IncompatibleWorkflow,
    InvalidDecision,
    InvalidStepId,
    InvalidStoreURL,
    KeyUnavailable,
    LimitReached,
    LimitsRefused,
    LostOwnership,
    MessageRefused,
    MigrationMismatch,
    MissingExtra,
    NeedsReconciliation,
    NotJSON,
    PruneRefused,
    ReplayMismatch,
    ResolutionRefused,
    RetryRefused,
    RunBlocked,
    RunCancelled,
    RunConflict,
    RunFailed,
    RunFileInvalid,
    RunNotFound,
    RunOwned,
    RunWaiting,
    SafepointError,
    SchemaTooNew,
    SecretRefused,
    SentBySource,
    Sleeping,
    SliceEnded,
    StaleCheckpoint,
    StepAttemptsExhausted,
    StepFailed,
    StoreError,
    StoreUnavailable,
    TransactionUncertain,
    TransientFailure,
    UsageError,
    VerificationFailed,
    WaitAnswered,
    WaitTimedOut,
    WorkflowNotFound,
)

RECORD = {"phase": "uncertain_effect", "step_id": "s"}
T = 1_767_225_600_000  # an epoch-ms moment

# One of each, built as the library builds them (positionally, where it does).
EXAMPLES: list[BaseException] = [
    SafepointError("something went wrong"),
    UsageError("say who approves: by='name'", step_id="s"),
    RunNotFound("r"),
    RunConflict("r", "with other inputs"),
    WorkflowNotFound("wf", "r"),
    NotJSON("the result", "$.items[1]", "datetime", "s"),
    SecretRefused("the inputs", "$.api_key", "a key-like name", "s"),
    InvalidDecision("decide", "None"),
    InvalidStepId("", "it is blank"),
    ResolutionRefused("r", "the run moved", owner_answer="applied", receipt={"id": 7}),
    ApprovalRefused("r", "s", "nothing waits", revoking=True),
    GateApproved(
        "r",
        "s",
        "approved already",
        operation_id="op",
        approval_id="a1",
        approved_by="ana",
        approved_at=T,
        went_out=False,
    ),
    MessageRefused("r", "go", "the run has ended"),
    WaitAnswered(
        "r", "go", "answered already", step_id="w", answered_by="ana", answered_at=T, waits_at="w#2"
    ),
    LimitsRefused("r", "the run moved", state_revision=4, expected_revision=3),
    ForkRefused("r", "no such step", choices=["a", "b"], operation_id="op"),  # type: ignore[arg-type]
    RetryRefused("r", "it is not failed"),
    PruneRefused("no status 'running'"),
    RunFileInvalid("steps[3].kind", "'bogus' is no step kind", "upgrade safepoint"),
    InvalidStoreURL("ftp://x", "no such scheme"),
    MissingExtra("postgres", "psycopg", needed_by="the pool"),
    RunOwned("r", "w1", T),
    ClaimedInFamily("r", "op", "r0", "op0"),
    RunFailed("r", "ValueError", "bad"),
    LimitReached("run 'r' is stopped at a limit", run_id="r", record=RECORD),
    BudgetExhausted("r", 3, 4),
    BudgetExhausted("r", 100.0, kind="tokens", spent=120.0, step_id="s"),
    DeadlineExceeded("r", T, "s", retry_at=T + 1000),
    StepAttemptsExhausted("r", "s", 3, 3, "TimeoutError", "slow"),
    RunCancelled("r", "asked by ana"),
    StepFailed("r", "s", "ValueError", "bad", 2),
    EffectRejected("r", "s", "op", {"code": 402}),
    RunWaiting("run 'r' waits"),  # a family only its members are raised as
    AwaitingApproval("r", "s", "op", "sha256:aa", None, "no approval yet"),
    ApprovalInvalid("r", "s", "op", "sha256:aa", "sha256:bb", "the payload changed"),
    AwaitingMessage("r", "w", "go", T),
    Sleeping("r", "z", T),
    WaitTimedOut("r", "w", "go", T),
    TransientFailure("model API answered 429", retry_after=2.0),
    StoreError("the store is read-only", path="/tmp/x.db", run_id="r", operation_id="op"),
    StoreUnavailable("cannot reach the store", url="postgresql://h/db"),
    SchemaTooNew(9, 8),
    MigrationMismatch(3),
    CorruptRecord("safepoint_steps", "r/s", "bad JSON"),
    ArtifactMissing("sha256:aa"),
    ArtifactCorrupt("sha256:aa", "sha256:bb"),
    KeyUnavailable("k1", "safepoint_steps.result (r, s)"),
    DecryptionFailed("k1", "safepoint_steps.result (r, s)"),
    RunBlocked("run 'r' is blocked", run_id="r", record=RECORD),
    NeedsReconciliation("r", "s", "op", "the owner did not answer", RECORD),
    VerificationFailed("r", "s", "op", "the total is off"),
    StaleCheckpoint("r", "s", "the input hash moved"),
    ReplayMismatch("r", "s", "a read where an effect was"),
    TransactionUncertain("r", "s", "the connection was committed"),
    IncompatibleWorkflow("r", "wf@1", "wf@2"),
    SentBySource("r", "s", "op", "r0", "another payload"),
    HistoryLimitReached("r", 1000, 1000),
    LostOwnership("r", 7),
    Cancelled("r"),
    ContinueAsNew("r", {"n": 2}),
    SliceEnded("r", "s", 1.5, 1.52),
]


def test_every_public_error_has_an_example() -> None:
    public = {
        getattr(errors, name)
        for name in errors.__all__
        if issubclass(getattr(errors, name), BaseException) and not issubclass(getattr(errors, name), Warning)
    }
    assert {type(error) for error in EXAMPLES} == public


@pytest.mark.parametrize("error", EXAMPLES, ids=lambda error: type(error).__name__)
@pytest.mark.parametrize("trip", [lambda e: pickle.loads(pickle.dumps(e)), copy.copy, copy.deepcopy])
def test_an_error_pickles_and_copies_with_its_fields(error: BaseException, trip: object) -> None:
    again = trip(error)  # type: ignore[operator]
    assert type(again) is type(error)
    assert vars(again) == vars(error)
    assert again.args == error.args == (error.message,)  # type: ignore[attr-defined]
    assert str(again) == str(error)
    assert repr(again) == repr(error)
    assert type(error).__module__ == "safepoint.errors"


def test_a_declared_errors_fields_are_its_constructor_parameters() -> None:
    error = NeedsReconciliation("r", "s", "op", "the owner did not answer")
    assert (error.run_id, error.step_id, error.operation_id, error.reason, error.record) == (
        "r",
        "s",
        "op",
        "the owner did not answer",
        None,
    )
    assert [f.name for f in dataclasses.fields(NeedsReconciliation)] == [
        "run_id",
        "step_id",
        "operation_id",
        "reason",
        "record",
    ]
    assert RunNotFound("r").step_id is None  # a family's optional field, absent from the member
    resumed = BudgetExhausted("r", 3, 4)
    assert (resumed.limit, resumed.spent) == (3, 4)  # the budget under every limit's name
    assert ForkRefused("r", "no", choices=["a"]).choices == ("a",)  # type: ignore[arg-type]
    assert IncompatibleWorkflow("r", "wf@1", "wf@2").changes == ["wf@1 became wf@2"]
    with pytest.raises(TypeError):
        RunConflict("r")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        WaitAnswered("r", "go", "answered already", "w")  # type: ignore[call-arg]


def test_errors_compare_by_identity_and_hash() -> None:
    one, other = RunNotFound("r"), RunNotFound("r")
    assert one != other
    assert len({one, other}) == 2


def test_the_tree_of_errors_names_every_one() -> None:
    """``safepoint.errors``'s docstring draws the tree a reader looks an error up in."""
    missing = [name for name in errors.__all__ if f" {name} " not in f"{errors.__doc__} ".replace("\n", " ")]
    assert not missing, f"draw them in the tree of safepoint/errors/__init__.py: {missing}"
