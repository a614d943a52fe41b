"""`twinfer serve`: an OpenAI-compatible HTTP server over either engine.

app.py (routes) -> translate.py (request bodies to prompts and SamplingParams) -> generation.py
(one HTTP request's engine requests) -> engine_loop.py (the engine on a thread, fed by a queue) or
engine_process.py (the engine in a child process) -> choice.py / detokenize.py (token deltas to text,
logprobs, stop strings) -> responses.py (API shapes). launch.py builds a server from a checkpoint and
runs it in a thread; cli.py is `twinfer serve`.
"""
