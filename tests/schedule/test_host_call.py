"""Host calls (`graph.host_call`): one kernel calling a function of this process between the kernels producing
its source and those reading its result; a failing function stops the program with its own error."""

from __future__ import annotations

import numpy as np
import pytest

import tensorgraphs as tg
from tensorgraphs.backends.cpu import CPU
from tensorgraphs.codegen.loop_ir import HostCall
from tensorgraphs.graph.host_call import host_call
from tensorgraphs.runtime.host_calls import register_host_function

CALLS: list[np.ndarray] = []


def record_and_negate(sources: list[np.ndarray], output: np.ndarray) -> None:
    CALLS.append([source.copy() for source in sources])
    np.negative(np.concatenate(sources), out=output)


def refuse(sources: list[np.ndarray], output: np.ndarray) -> None:
    raise ConnectionError("peer went away")


register_host_function("test.negate", record_and_negate)
register_host_function("test.refuse", refuse)


def program(function: str, x: np.ndarray):  # noqa: ANN201
    """[negate(2x + 1, x[::-1, :] - 1), then negate(3 * that)] + 1; x is 2-D."""
    t = tg.tensor(x)
    first = host_call(function, [(t * 2 + 1).node, (t.flip(0) - 1).node])
    second = host_call(function, [(tg.Tensor(first) * 3).node], after=first)
    return CPU.program([(tg.Tensor(second) + 1).node])


def test_the_program_calls_the_host_between_producer_and_consumer() -> None:
    x = np.arange(100_000, dtype=np.float32).reshape(100, 1000)
    compiled, inputs = program("test.negate", x)
    CALLS.clear()
    (result,) = compiled.run([n.arg.data for n in inputs])
    np.testing.assert_array_equal(CALLS[0][0], (x * 2 + 1).ravel())
    np.testing.assert_array_equal(CALLS[0][1], (x[::-1] - 1).ravel())
    first = -np.concatenate([(x * 2 + 1).ravel(), (x[::-1] - 1).ravel()])
    np.testing.assert_array_equal(CALLS[1][0], first * 3)
    np.testing.assert_array_equal(result, -(first * 3) + 1)
    calls = [k for k, kernel in enumerate(compiled.kernels) if any(isinstance(s, HostCall) for s in kernel.body)]
    assert len(calls) == 2 and calls[0] < calls[1]
    assert [s.after for s in compiled.kernels[calls[1]].body] != [None]  # waits for the first


def test_a_failing_host_function_stops_the_program_with_its_error() -> None:
    compiled, inputs = program("test.refuse", np.ones((2, 5), np.float32))
    with pytest.raises(ConnectionError, match="peer went away"):
        compiled.run([n.arg.data for n in inputs])


def test_host_calls_have_no_decomposition() -> None:
    node = host_call("test.negate", [tg.ones(3).node])
    with tg.device("numpy"), pytest.raises(tg.UnsupportedError, match="only inside a compiled program"):
        tg.Tensor(node).numpy()


def test_asynchronous_host_calls_start_early_and_finish_late() -> None:
    """A call placed "early" runs right after what it reads is written, one placed "late" (and what reads its
    result) after every other kernel: the kernels between run while the started work proceeds."""
    t = tg.tensor(np.arange(60_000, dtype=np.float32).reshape(200, 300))
    started = host_call("test.negate", [(t * 2).node], placement="early")
    finished = tg.Tensor(host_call("test.negate", [started], placement="late"))
    others = [(t + 1).sum(0), (t * 3).amax(1), (t - 4).sum(1)]  # independent work, one kernel each
    compiled, inputs = CPU.program([(finished + 1).node, *(o.node for o in others)])
    CALLS.clear()
    results = compiled.run([n.arg.data for n in inputs])
    np.testing.assert_array_equal(results[0], (np.arange(60_000, dtype=np.float32) * 2) + 1)
    order = [next((s.placement for s in k.body if isinstance(s, HostCall)), "") for k in compiled.kernels]
    start, finish = order.index("early"), order.index("late")
    assert start == 1 and finish == len(order) - 2  # after the product; before the last kernel, which reads it
    assert finish - start > 3


def test_each_started_work_runs_after_only_what_it_reads_and_is_waited_for_in_the_order_started() -> None:
    """Two collectives, the second started after the first: the first starts right after the kernel producing its
    source, before the kernels producing the second's (which the graph lists first); the waits come in the
    order the work was started, though the graph lists the second's first."""
    x = np.linspace(-1, 1, 60_000, dtype=np.float32).reshape(200, 300)
    t = tg.tensor(x)
    second_source, first_source = (t * 3).sum(0), (t * 2).exp2()  # the small one first, to keep less memory
    first = host_call("test.negate", [first_source.node], placement="early")
    second = host_call("test.negate", [second_source.node], first, placement="early")
    waits = [tg.Tensor(host_call("test.negate", [started], placement="late")) for started in (second, first)]
    compiled, inputs = CPU.program([(waits[0] + 1).node, (waits[1] + 1).node])
    results = compiled.run([n.arg.data for n in inputs])
    np.testing.assert_allclose(results[0], (x * 3).sum(0) + 1, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(results[1], np.exp2(x * 2).ravel() + 1, rtol=1e-6)
    calls = [(k, s) for k, kernel in enumerate(compiled.kernels) for s in kernel.body if isinstance(s, HostCall)]
    (start_first, first_call), (start_second, second_call), (wait_first, first_wait), (wait_second, _) = calls
    writers = {b.name: k for k, kernel in enumerate(compiled.kernels) for b in kernel.buffers if b.writes}
    assert first_call.after is None and second_call.after == first_call.output
    assert start_first == writers[first_call.sources[0]] + 1 < writers[second_call.sources[0]] < start_second
    assert first_wait.sources == (first_call.output,) and start_second < wait_first < wait_second
