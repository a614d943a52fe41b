"""Session-wide test set-up shared by tests/ and fuzz/.

Triton reads TRITON_INTERPRET when a kernel is *defined* (at import of the module that
holds it), so it must be set here, before any test module imports fast.kernels.
On a machine without a GPU the kernels then run through Triton's CPU interpreter.
"""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path

# Triton's interpreter computes tl.dot with numpy's matmul, that is OpenBLAS. The sgemm kernel
# OpenBLAS picks on AMD Zen CPUs (its "Haswell" kernel) rounds rows 6-11 of every 12-row block
# differently from the others, so a row's result depends on where it sits in a tile: the CPU checks
# that the fast engine is batch-invariant (bit for bit, as it is on the GPU) then fail on those
# machines only, and on any machine whose environment names that kernel (this project's machines
# have set OPENBLAS_CORETYPE=Haswell). The Sandybridge kernel (AVX, present on every x86-64 CPU that
# runs torch) has no such dependence. It must be chosen before numpy loads OpenBLAS, hence here,
# before torch, and it overrides the environment's choice.
if platform.machine() in ("x86_64", "AMD64"):
    os.environ["OPENBLAS_CORETYPE"] = "Sandybridge"

import pytest  # noqa: E402
import torch  # noqa: E402

HAS_CUDA = torch.cuda.is_available()


def list_interpreter_builtins_once() -> None:
    """Make Triton's interpreter list triton.language's builtins once instead of at every call.

    Before each kernel program and each call of a nested @triton.jit function, the interpreter swaps
    triton.language's builtins for its numpy versions (`_patch_builtin`), finding them with
    inspect.getmembers over the whole module: about a fifth of a fast-engine test's CPU time (0.69 s
    against 0.89 s a decode step of the test model, measured with process_time). Which names are
    builtins never changes, so they are listed once per module here; each is still checked and
    swapped at every call, exactly as before. Where the interpreter has no `_patch_builtin` (another
    Triton version), nothing is changed.
    """
    import inspect

    import triton.language as tl
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_builtin", None)
    patch_attr = getattr(interpreter, "_patch_attr", None)
    if original is None or patch_attr is None:
        return
    builtin_names: dict[int, list[str]] = {}

    def patch_builtin(pkg, builder, scope) -> None:
        names = builtin_names.get(id(pkg))
        if names is None:
            names = builtin_names[id(pkg)] = [n for n, m in inspect.getmembers(pkg) if tl.core.is_builtin(m)]
        for name in names:
            member = getattr(pkg, name)
            if tl.core.is_builtin(member):
                patch_attr(pkg, name, member, builder, scope)

    interpreter._patch_builtin = patch_builtin


if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # The test models are tiny: extra intra-op threads only add contention (a 64x128 matmul was
    # 100x slower with 2 threads than with 1 on the 2-core CI machine).
    torch.set_num_threads(1)
    list_interpreter_builtins_once()
else:
    # pytest-xdist runs one worker per core (addopts: -n auto): each worker's CPU work (the reference engine,
    # transformers) gets its share of the cores instead of every worker starting one thread per core.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` need CUDA: on a CPU machine they are reported as skipped, never passed. Tests
    marked `interpreter` run Triton's CPU interpreter itself (a kernel's CPU path): on a CUDA machine,
    where TRITON_INTERPRET stays unset so that the engines' tests run on the GPU, they are skipped with
    that reason; their kernels' GPU tests run there instead."""
    if HAS_CUDA:
        marker, reason = (
            "interpreter",
            "runs Triton's CPU interpreter, which is off on a CUDA machine (marker: interpreter)",
        )
    else:
        marker, reason = "gpu", "needs a CUDA device (marker: gpu)"
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if marker in item.keywords:
            item.add_marker(skip)
    if HAS_CUDA:
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        from tests.gpu_sharing import gpu_alone_tests_last

        items[:] = gpu_alone_tests_last(large_gpu_tests_first(items, workers, min(workers, GPU_TEST_SLOTS)))


# At most this many `large_gpu` tests run at once, whatever the number of pytest-xdist workers: at the 0.6B shape
# one holds up to ~20 GiB (weights in two dtypes, transformers' twin, two engines), and eight side by side
# with the published report's kernel tests ran the H200 out of memory (reports/results/fast_gpu/suite_834ee68/).
# The other `gpu` tests (a kernel against its reference, a tiny model) hold a GiB or two and run freely: with every
# `gpu` test held to four slots, the whole suite on one H200 had not ended at 500 s (suite_alone/).
GPU_TEST_SLOTS = 4


def large_gpu_tests_first(items: list[pytest.Item], workers: int, gpu_workers: int) -> list[pytest.Item]:
    """The collection reordered so that `gpu_workers` pytest-xdist workers start with the `large_gpu` tests.

    worksteal hands worker k the k-th contiguous slice of the collection (sizes remaining // workers left),
    and the large GPU tests sit together at the end of tests/fast/: the longest of them (a minute or more each
    at the 0.6B shape) then ran last, on the one worker whose slice held them, after every other worker was
    done (the whole suite on one H200 was still running them at 450 s). Dealt round-robin to the front of
    the first `gpu_workers` slices, they start at once, side by side, as many as there are GPU slots.
    Every worker computes the same order."""
    if workers <= 1:
        return items
    large = [item for item in items if "large_gpu" in item.keywords]
    rest = [item for item in items if "large_gpu" not in item.keywords]
    ordered: list[pytest.Item] = []
    remaining = len(items)
    for worker in range(workers):
        size = remaining // (workers - worker)
        remaining -= size
        share = large[worker::gpu_workers][:size] if worker < gpu_workers else []
        ordered += share
        ordered += rest[: size - len(share)]
        del rest[: size - len(share)]
    placed = set(ordered)
    return ordered + [item for item in large if item not in placed] + rest


# What a worker's caching allocator may keep after a test that is not `large_gpu`: a kernel test holds a GiB or
# less, and emptying the cache costs a device synchronisation (0.35 s a teardown on the H200 beside seven workers).
KEEP_CACHED_BYTES = 2 * 2**30


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item):
    """On CUDA, each test gives back the memory its process's caching allocator keeps. The fast engine sizes
    its pool from the device's free memory (and checks a requested pool against it), and seven other pytest
    workers share the GPU: memory one worker's finished tests still held counted as used for every other
    worker's engines. A garbage collection first (an engine dropped in a reference cycle holds its pool until
    collected) and the cache emptied after `large_gpu` tests, whose engines hold GiBs; after other tests only
    when the cache holds more than KEEP_CACHED_BYTES (the collection too: an engine of a test that is not
    `large_gpu`, left in a reference cycle, held 80 GiB for the rest of its worker's tests, run_0f2cca6/).
    After every test it cost about 0.35 s, 416 s of teardowns
    against 2,554 s of calls on one H200 (reports/results/fast_gpu/suite_alone/run_337079b/durations.txt)."""
    result = yield  # the test's fixtures are torn down first
    if not HAS_CUDA:
        return result
    if "large_gpu" in item.keywords or torch.cuda.memory_reserved() > KEEP_CACHED_BYTES:
        import gc

        gc.collect()
        torch.cuda.empty_cache()
    return result


# Where gpu_shared_or_alone's lock files are, on each test that holds the GPU through them.
GPU_SHARING_DIRECTORY = pytest.StashKey[Path]()
GPU_HOLDERS_SECTION = "GPU holders"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A failure of a test that held the GPU beside other workers carries a "GPU holders" section: each process
    holding the GPU as it failed, by PID, and its test (tests/gpu_sharing.py). CUDA's out-of-memory message names
    the processes by PID only; a pool that did not fit named nobody (run_b6e0169/)."""
    report = yield
    directory = item.stash.get(GPU_SHARING_DIRECTORY, None)
    if report.failed and directory is not None:
        from tests.gpu_sharing import holders

        report.sections.append((GPU_HOLDERS_SECTION, holders(directory)))
    return report


@pytest.fixture(autouse=True)
def gpu_shared_or_alone(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """On CUDA with several pytest-xdist workers, every test holds the GPU shared, and a `gpu_alone` test holds it
    alone (tests/gpu_sharing.py: a test of sizing from the device's free memory must not see the other workers'
    engines grow under it). Defined before gpu_test_slot, so it is taken first and let go last. Elsewhere, nothing."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not HAS_CUDA or workers <= 1:
        yield
        return
    from tests.gpu_sharing import gpu_alone, gpu_shared, named_holder, refuse_whole_gpu_pools

    # The run's shared temporary root (pytest-xdist workers share the parent of their basetemp).
    directory = tmp_path_factory.getbasetemp().parent / "gpu-sharing"
    alone = "gpu_alone" in request.keywords
    request.node.stash[GPU_SHARING_DIRECTORY] = directory
    # A test holding the GPU shared may not let an engine size its pool from most of it (an alone test may).
    checks = contextlib.nullcontext() if alone else pytest.MonkeyPatch.context()
    with (gpu_alone if alone else gpu_shared)(directory), named_holder(directory, request.node.nodeid), checks as patch:
        if patch is not None:
            refuse_whole_gpu_pools(patch)
        yield


@pytest.fixture(autouse=True)
def gpu_test_slot(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """A `large_gpu` test on CUDA holds one of GPU_TEST_SLOTS slots, lock files shared by the run's xdist
    workers (flock: a slot frees itself if its worker dies). Elsewhere, and for other tests, nothing."""
    if not HAS_CUDA or "large_gpu" not in request.keywords:
        yield
        return
    import fcntl
    import time

    # The run's shared temporary root (pytest-xdist workers share the parent of their basetemp).
    shared = tmp_path_factory.getbasetemp().parent / "gpu-slots"
    shared.mkdir(exist_ok=True)
    while True:
        for slot in range(GPU_TEST_SLOTS):
            handle = open(shared / f"slot-{slot}", "a")  # held until the test ends
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
                handle.close()
            return
        time.sleep(0.2)


def dump_stacks_on_sigusr1() -> None:
    """With TWINFER_STACK_DUMP_DIR set, SIGUSR1 writes every thread's stack of this process (the pytest
    controller or an xdist worker: each loads this file) to DIR/stacks-PID.txt, and so does the passing of
    TWINFER_STACK_DUMP_AFTER_S seconds where that is set: a run that does not end by its time limit (a device
    call) says where each process waits. (The workers run in a process group of their own: a signal to the
    session's group reaches the controller only, suite_alone/.)"""
    directory = os.environ.get("TWINFER_STACK_DUMP_DIR")
    if not directory:
        return
    import faulthandler
    import signal

    os.makedirs(directory, exist_ok=True)
    # Kept open for the process's life: faulthandler writes to the descriptor from the signal handler.
    dump_file = open(os.path.join(directory, f"stacks-{os.getpid()}.txt"), "w")  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=dump_file, all_threads=True)
    after_s = os.environ.get("TWINFER_STACK_DUMP_AFTER_S")
    if after_s:
        # A daemon thread, not faulthandler.dump_traceback_later: a process forked from this one (the mutation
        # runner's children, fuzz/mutation/worker.py) inherits that watchdog's state without its thread, and
        # its pytest then hung or failed (suite_alone/run_02f13a1/).
        import threading

        timer = threading.Timer(float(after_s), faulthandler.dump_traceback, (dump_file, True))
        timer.daemon = True
        timer.start()


dump_stacks_on_sigusr1()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With TWINFER_FAILURE_LOG set, each failure's traceback is appended to that file as it happens; with
    TWINFER_DURATION_LOG set, each phase's seconds (setup, call, teardown), outcome and test: a run stopped at
    its time limit (a device call) still says why what failed before that failed, and where the time went.
    (With -v, pytest prints tracebacks and --durations only at the end of the session.) Under pytest-xdist the
    controller writes them, as each worker's report reaches it; a worker writing too gave every line twice."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    path = os.environ.get("TWINFER_FAILURE_LOG")
    if path and report.failed:
        with open(path, "a", encoding="utf-8") as log:
            held = "".join(f"---- {title}\n{text}\n" for title, text in report.sections if title == GPU_HOLDERS_SECTION)
            log.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext}\n{held}\n")
    path = os.environ.get("TWINFER_DURATION_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"{report.duration:8.2f} {report.when:8} {report.outcome:7} {report.nodeid}\n")
