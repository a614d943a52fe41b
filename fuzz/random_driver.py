"""Runs a hypothesis state machine with plain random draws: the soak's driver (fuzz/soak.py).

Under `run_state_machine_as_test` a step pays for hypothesis's engine (its tree of examples, mutations of
earlier examples, what it keeps for shrinking) and for ConjectureData's bookkeeping of every draw: profiled,
two thirds of an allocator-machine step. That buys shrinking and a guided search, which the pytest runs
keep. A soak wants the most steps per second, so here the same machines, rules, strategies and checks run
with each rule's arguments drawn straight from a seeded `random.Random` (fuzz/fast_draws.py). A failure is
not shrunk: it is reported with the seed and the rules run, and `run_example` with that seed replays it.

It reads the rule tables hypothesis builds for a RuleBasedStateMachine (`rules`, `invariants`,
`_initialize_rules_to_run`, each rule's `arguments_strategies` and `preconditions`); a hypothesis that
changes them fails `fuzz/test_soak.py`, not silently.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis.control import BuildContext
from hypothesis.internal.conjecture.data import ConjectureData
from hypothesis.stateful import RuleBasedStateMachine

from fuzz.fast_draws import FastDraws


@dataclass
class ExampleTrace:
    """The rules an example ran, by name, with their arguments' reprs (the last ones: a failure's story)."""

    seed: int
    steps: list[str] = field(default_factory=list)


def run_example(machine_class: type[RuleBasedStateMachine], seed: int, max_steps: int) -> ExampleTrace:
    """One example: the initialize rules, then `max_steps` rules chosen uniformly among those whose
    preconditions hold, then teardown. Raises what a check raises, with the trace attached as
    `failure.trace`."""
    rng = random.Random(seed)
    trace = ExampleTrace(seed)
    machine = machine_class()
    draws = FastDraws(rng, machine)
    # Strategies' bookkeeping (`.map` records its calls) expects a build context: an idle one serves.
    with BuildContext(ConjectureData(random=rng), is_final=False, wrapped_test=None):
        try:
            for rule in list(machine._initialize_rules_to_run):
                _run_rule(machine, rule, draws, trace)
            machine._initialize_rules_to_run.clear()
            for _ in range(max_steps):
                enabled = [rule for rule in machine.rules if all(check(machine) for check in rule.preconditions)]
                if not enabled:
                    break
                _run_rule(machine, enabled[rng.randrange(len(enabled))], draws, trace)
            machine.teardown()
        except Exception as failure:
            failure.trace = trace  # type: ignore[attr-defined]
            raise
    return trace


def _run_rule(machine: RuleBasedStateMachine, rule: Any, draws: FastDraws, trace: ExampleTrace) -> None:
    arguments = {name: draws.draw(strategy) for name, strategy in rule.arguments_strategies.items()}
    function: Callable[..., Any] = rule.function
    trace.steps.append(f"{function.__name__}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})")
    function(machine, **arguments)
    for invariant in machine.invariants:
        invariant.function(machine)
