"""`twinfer diff`: one prompt set through two or more engines, every pair compared token by token.

- `command.py`: the command line (options, the fixed prompt set, the printed summary).
- `diff_run.py`: the run: greedy traces from each engine, then every pair compared by spec.agreement.
- `differential.py`: traces from transformers and from twinfer's engines, and the comparison record;
  the differential tests build their traces with it too.
- `endpoint.py`: traces from any server behind the OpenAI HTTP API (`openai:URL`), free-running and
  teacher-forced; the report's endpoint cells use it too.
"""
