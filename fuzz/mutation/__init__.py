"""Mutation testing of the modules the verification rests on: `python -m fuzz.mutation`.

| module | its job |
|---|---|
| `targets.toml`, `targets.py` | data: each mutated module and the tests that cover it (fastest first) |
| `equivalent.toml`, `equivalent.py` | data: mutants judged equivalent, each with the reason |
| `mutants.py` | the mutants of a module, made by cosmic-ray's operators (a chosen subset) |
| `worker.py` | one mutant's test run: a forked child imports the mutated source and runs pytest in-process |
| `record.py` | the JSON record, rewritten after every mutant so a killed run still reports |
| `run.py`, `__main__.py` | the run: baselines, N worker processes, the record, the command line |
"""
