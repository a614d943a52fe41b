"""The mutants of a module: cosmic-ray's operators, applied one occurrence at a time.

cosmic-ray (a maintained mutation tool) supplies the operators and the mutation of parso trees; which
operators run is chosen here. Its full set replaces every binary operator with each of the other
eleven and every comparison with each of the other seven: most of those mutants die on the first test
and only multiply the run's cost. The subset is the classic one (that of mutmut and of the mutation
literature's "sufficient" operators): each arithmetic operator with its inverse, each comparison with
its boundary twin and its negation, booleans flipped, `and`/`or` swapped, `not` added or removed,
numbers off by one, loops skipped, `break`/`continue` swapped, caught exceptions replaced. Decorator
removal and cosmic-ray's random variable operators are left out: the first mostly gives equivalent
mutants (a cache dropped) or import-time crashes, the second is not reproducible.

Mutations inside annotations are skipped: every module imports `annotations` from `__future__`, so an
annotation is never evaluated and its mutant (`int | None` to `int & None`) is equivalent by
construction.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import logging
from dataclasses import dataclass
from functools import cache
from pathlib import Path

logger = logging.getLogger(__name__)

OPERATORS = (
    # arithmetic: each with its inverse
    "core/ReplaceBinaryOperator_Add_Sub",
    "core/ReplaceBinaryOperator_Sub_Add",
    "core/ReplaceBinaryOperator_Mul_Div",
    "core/ReplaceBinaryOperator_Div_Mul",
    "core/ReplaceBinaryOperator_FloorDiv_Mul",
    "core/ReplaceBinaryOperator_Mod_FloorDiv",
    "core/ReplaceBinaryOperator_Pow_Mul",
    "core/ReplaceBinaryOperator_LShift_RShift",
    "core/ReplaceBinaryOperator_RShift_LShift",
    "core/ReplaceBinaryOperator_BitOr_BitAnd",
    "core/ReplaceBinaryOperator_BitAnd_BitOr",
    "core/ReplaceBinaryOperator_BitXor_BitOr",
    # comparisons: boundary and negation
    "core/ReplaceComparisonOperator_Eq_NotEq",
    "core/ReplaceComparisonOperator_NotEq_Eq",
    "core/ReplaceComparisonOperator_Lt_LtE",
    "core/ReplaceComparisonOperator_LtE_Lt",
    "core/ReplaceComparisonOperator_Gt_GtE",
    "core/ReplaceComparisonOperator_GtE_Gt",
    "core/ReplaceComparisonOperator_Lt_GtE",
    "core/ReplaceComparisonOperator_Gt_LtE",
    "core/ReplaceComparisonOperator_Is_IsNot",
    "core/ReplaceComparisonOperator_IsNot_Is",
    # unary and boolean
    "core/ReplaceUnaryOperator_USub_UAdd",
    "core/ReplaceUnaryOperator_Delete_Not",
    "core/AddNot",
    "core/ReplaceTrueWithFalse",
    "core/ReplaceFalseWithTrue",
    "core/ReplaceAndWithOr",
    "core/ReplaceOrWithAnd",
    # control flow and constants
    "core/ReplaceBreakWithContinue",
    "core/ReplaceContinueWithBreak",
    "core/ZeroIterationForLoop",
    "core/ExceptionReplacer",
    "core/NumberReplacer",
)


@dataclass(frozen=True)
class Mutant:
    """One mutation of one module. `key` names it across runs and edits elsewhere in the module: the
    operator, the enclosing definition, the line before and after and which of equal such lines it is."""

    module: str  # repository-relative path, e.g. "spec/scheduling.py"
    operator: str
    occurrence: int  # cosmic-ray's index of this operator's positions in the module
    line: int
    definition: str  # the enclosing function or class ("<module>" at top level)
    original: str  # the mutated line before, stripped
    mutated: str  # and after, stripped
    repeat: int  # 0 for the first mutant with this (module, operator, definition, original, mutated)
    diff: str
    source: str  # the whole mutated module

    @property
    def key(self) -> str:
        text = "\x00".join((self.module, self.operator, self.definition, self.original, self.mutated, str(self.repeat)))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def mutants_of(root: Path, module: str) -> list[Mutant]:
    """Every mutant of `module` (a path under `root`) by OPERATORS, outside annotations."""
    from cosmic_ray.ast import ast_nodes, get_ast
    from cosmic_ray.ast.ast_query import ASTQuery
    from cosmic_ray.mutating import mutate_code

    source = (root / module).read_text(encoding="utf-8")
    skipped = annotation_spans(source)
    made: list[Mutant] = []
    seen: dict[tuple[str, ...], int] = {}
    for name, operator in operators():
        tree = get_ast(source)
        positions = [(node, start) for node in ast_nodes(tree) for start, _ in operator.mutation_positions(node)]
        for occurrence, (node, start) in enumerate(positions):
            if _inside(start, skipped):
                continue
            try:
                mutated_source = mutate_code(source, operator, occurrence)
            except Exception as error:  # noqa: BLE001 - an operator that cannot handle a node: no mutant there
                logger.warning("%s: %s at line %d cannot mutate: %r", module, name, start[0], error)
                continue
            if mutated_source is None or mutated_source == source:
                continue
            line = start[0]
            original, mutated = _changed_line(source, mutated_source, line)
            definition = ASTQuery(node).get_definition_name() or "<module>"
            identity = (module, name, definition, original, mutated)
            repeat = seen.get(identity, 0)
            seen[identity] = repeat + 1
            made.append(
                Mutant(
                    module=module,
                    operator=name,
                    occurrence=occurrence,
                    line=line,
                    definition=definition,
                    original=original,
                    mutated=mutated,
                    repeat=repeat,
                    diff=unified_diff(module, source, mutated_source),
                    source=mutated_source,
                )
            )
    logger.info("%s: %d mutants", module, len(made))
    return made


@cache
def operators() -> tuple[tuple[str, object], ...]:
    """(name, instance) of each operator of OPERATORS."""
    import cosmic_ray.plugins

    return tuple((name, cosmic_ray.plugins.get_operator(name)()) for name in OPERATORS)


Span = tuple[tuple[int, int], tuple[int, int]]


def annotation_spans(source: str) -> list[Span]:
    """(start, end) (line, column) of every annotation: parameters, returns, annotated assignments."""
    spans: list[Span] = []
    for node in ast.walk(ast.parse(source)):
        annotations: list[ast.expr | None] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg]
            annotations += [argument.annotation for argument in every if argument is not None]
            annotations.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
        for annotation in annotations:
            if annotation is not None:
                start = (annotation.lineno, annotation.col_offset)
                end = (annotation.end_lineno or annotation.lineno, annotation.end_col_offset or 0)
                spans.append((start, end))
    return spans


def _inside(position: tuple[int, int], spans: list[Span]) -> bool:
    return any(start <= position < end for start, end in spans)


def _changed_line(source: str, mutated_source: str, line: int) -> tuple[str, str]:
    """The line the mutation starts on, before and after (operators change one line, or insert a
    line such as ZeroIterationForLoop's `for x in []:`; the first changed line names it)."""
    before, after = source.splitlines(), mutated_source.splitlines()
    for index in range(max(0, line - 1), min(len(before), len(after))):
        if before[index] != after[index]:
            return before[index].strip(), after[index].strip()
    return before[line - 1].strip() if line - 1 < len(before) else "", ""


def unified_diff(module: str, source: str, mutated_source: str) -> str:
    lines = difflib.unified_diff(
        source.splitlines(), mutated_source.splitlines(), f"a/{module}", f"b/{module}", lineterm="", n=1
    )
    return "\n".join(lines)
