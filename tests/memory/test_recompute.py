"""Recomputation: a cheap value read early and again after the peak is made twice instead of kept across it."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tensorgraphs as tg
from tensorgraphs.backends.cpu import CPU
from tensorgraphs.backends.numpy_backend import REFERENCE
from tensorgraphs.codegen.loop_ir import GemmCall
from tensorgraphs.graph.node import Node
from tensorgraphs.memory.liveness import temporaries
from tensorgraphs.memory.order import best_order
from tensorgraphs.memory.packing import live_bytes, plan_memory
from tensorgraphs.memory.recompute import is_cheap, recompute_for_memory, renamable, renamed
from tensorgraphs.memory.verify import verify_plan
from tensorgraphs.schedule.fusion import Schedule, schedule_kernels

pytestmark = pytest.mark.device("cpu", compile=True)  # checks generated C, small graphs included


def kept_across_a_peak(product_read_late: bool = True) -> list[Node]:
    """kept = exp(2 x@w1) is read by the next matmul and again at the very end, where x@w1 (a matmul: not cheap to
    make again) is read too; in between, a [32, 128] temporary makes the peak."""
    rng = np.random.default_rng(0)
    matrix = lambda *shape: tg.tensor(rng.normal(size=shape).astype(np.float32) * 0.2)  # noqa: E731
    x, w1, wide, narrow, w3 = matrix(32, 32), matrix(32, 32), matrix(32, 128), matrix(128, 32), matrix(32, 32)
    product = x @ w1
    kept = (product * 2).exp()
    middle = (kept @ wide).tanh() @ narrow
    late = (middle @ w3).sum() + (kept @ w3).sum()
    return [(late + product.sum() if product_read_late else late).node]


def test_the_kept_value_is_recomputed_after_the_peak() -> None:
    schedule = best_order(schedule_kernels(kept_across_a_peak()))
    recomputed = recompute_for_memory(schedule)
    again = [k for k in recomputed.kernels if k.name.endswith("_again")]
    assert len(again) == 1 and len(recomputed.kernels) == len(schedule.kernels) + 1
    (original,) = [k for k in recomputed.kernels if f"{k.name}_again" == again[0].name]
    assert is_cheap(original)
    (copy,) = [b.name for b in again[0].buffers if b.writes]
    (value,) = [b.name for b in original.buffers if b.writes]
    assert str(again[0]).split("\n", 1)[1] == str(original).split("\n", 1)[1].replace(f"{value}[", f"{copy}[")
    lifetimes = {life.name: life for life in temporaries(recomputed)}
    assert lifetimes[value].end < lifetimes[copy].start and lifetimes[copy].copy_of == value
    plan = plan_memory(recomputed)
    verify_plan(recomputed, plan)
    assert plan.naive_bytes == plan_memory(schedule).naive_bytes  # the copy is the same value: counted once
    assert f"{copy}: " in str(plan) and f"(recomputes {value})" in str(plan)
    assert live_bytes(recomputed) < live_bytes(schedule)
    assert recompute_for_memory(recomputed) == recomputed  # nothing left that helps


def test_not_recomputed_where_its_input_would_have_to_live_longer() -> None:
    """Without the late read of x@w1, recomputing exp(2 x@w1) would keep x@w1 live across the peak instead."""
    schedule = best_order(schedule_kernels(kept_across_a_peak(product_read_late=False)))
    assert recompute_for_memory(schedule) is schedule


def test_recomputed_program_equals_the_reference() -> None:
    """Poisoned arena (conftest): the copy is written before the late users read it."""
    roots = kept_across_a_peak()
    program, _ = CPU.program(roots)
    assert any(k.name.endswith("_again") for k in program.kernels)
    (got,) = CPU.evaluate(roots)
    (want,) = REFERENCE.evaluate(roots)
    np.testing.assert_allclose(got, want, rtol=1e-4)


def test_only_one_pass_kernels_are_cheap(handoff_schedule: Schedule) -> None:
    cheap = {k.name: is_cheap(k) for k in handoff_schedule.kernels}
    assert any("exp" in name and value for name, value in cheap.items())
    assert not any(value for name, value in cheap.items() if "matmul" in name or "sum" in name), cheap


def test_renamed_kernel_touches_the_new_buffer_everywhere(handoff_schedule: Schedule) -> None:
    named = lambda name, kernel: len(re.findall(rf"\b{name}\b", str(kernel)))  # noqa: E731
    gemms = 0
    for kernel in handoff_schedule.kernels:
        for buffer in kernel.buffers:
            assert renamable(kernel, buffer.name)
            new = renamed(kernel, buffer.name, "fresh")
            assert named(buffer.name, new) == 0
            assert named("fresh", new) == named(buffer.name, kernel) > 1  # the parameter and its accesses
            gemms += any(isinstance(s, GemmCall) for s in new.body)
    assert gemms, "a GEMM call names its operands in fields of its own"


def test_training_step_recomputes_what_the_backward_pass_reads_again(two_layer_step: Schedule) -> None:
    """In the transformer step (when written: the in-projection weight slices, and the first layer's ReLU output
    from the pre-activation kept anyway for the ReLU gradient), cheap values are made again for the backward."""
    ordered = best_order(two_layer_step)
    recomputed = recompute_for_memory(ordered)
    again = [k for k in recomputed.kernels if k.name.endswith("_again")]
    assert again and all(is_cheap(k) for k in again)
    assert live_bytes(recomputed) < 0.9 * live_bytes(ordered)
