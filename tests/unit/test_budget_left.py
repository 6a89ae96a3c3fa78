"""run.budget_left(): what a run may still spend, for loops that count their own limits per call."""

import safepoint as sp


def test_budget_left_is_the_budget_less_what_model_steps_recorded(memory_store: sp.Store) -> None:
    @sp.workflow("left", budget=sp.Budget(cost=1.0, model_calls=5))
    def left(run: sp.Run) -> list[object]:
        before = run.budget_left()
        run.model(
            "m", lambda **kw: {"cost": 0.25}, model="m", messages=[], usage=lambda r: {"cost": r["cost"]}
        )
        after = run.budget_left()
        return [before.cost, before.model_calls, before.tokens, after.cost, after.model_calls]

    assert sp.start(memory_store, left, run_id="l-1") == [1.0, 5, None, 0.75, 4]
