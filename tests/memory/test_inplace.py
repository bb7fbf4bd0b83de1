"""In-place writes: allowed only where every output element is computed from the same input element."""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import pytest

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.codegen.index import Var
from tensorgraphs.codegen.loop_ir import ConvCall, Kernel, KernelParam, Let, Lit, Load, Loop, Ref, Store
from tensorgraphs.graph.ops import Op
from tensorgraphs.kernels import gemm
from tensorgraphs.memory.inplace import alias_free, writes_in_place_safely
from tensorgraphs.memory.order import order_for_memory
from tensorgraphs.memory.packing import plan_memory
from tensorgraphs.memory.verify import MemoryPlanError, verify_plan
from tensorgraphs.schedule.fusion import BufferSpec, Schedule, schedule_kernels


def test_elementwise_kernel_may_overwrite_its_input(handoff_schedule: Schedule) -> None:
    (exp_kernel,) = [k for k in handoff_schedule.kernels if "exp" in k.name]
    (donor,) = [b.name for b in exp_kernel.buffers if not b.writes]
    (output,) = [b.name for b in exp_kernel.buffers if b.writes]
    assert writes_in_place_safely(exp_kernel, donor, output)
    assert plan_memory(handoff_schedule).in_place == [(donor, output)]
    assert not writes_in_place_safely(exp_kernel, output, donor)  # the donor must be read, the output written


CONSUMERS: dict[str, tuple[Callable[[tg.Tensor], tg.Tensor], bool]] = {
    "exp": (lambda p: (p * 0.5).exp(), True),
    "exp after subtracting a column mean": (lambda p: (p - p.mean(0)).exp(), True),
    "transpose": (lambda p: p.T.exp(), False),
    "flip": (lambda p: p.flip(1).exp(), False),
    "softmax (reads each row three times)": (lambda p: F.softmax(p, -1), False),
}


@pytest.mark.parametrize("name", CONSUMERS)
def test_handoff_only_where_each_element_reads_its_own(name: str) -> None:
    """The product x@x (read by two kernels) dies in the consumer, materialized because it feeds a matmul."""
    consumer, allowed = CONSUMERS[name]
    x = tg.tensor(np.random.default_rng(0).normal(size=(16, 16)).astype(np.float32))
    product = x @ x
    plan = plan_memory(order_for_memory(schedule_kernels([(consumer(product) @ x).node, product.sum(0).node])))
    assert bool(plan.in_place) == allowed, (name, plan.in_place)


def test_alias_free_kernel_reads_the_donor_through_the_output(handoff_schedule: Schedule) -> None:
    """Planned in place, a kernel takes one pointer for both, so its `restrict` parameters never alias."""
    ((donor, output),) = plan_memory(handoff_schedule).in_place
    before = handoff_schedule.kernels
    after = alias_free(before, [(donor, output)])
    changed = [(old, new) for old, new in zip(before, after) if old is not new]
    assert len(changed) == 1
    old, new = changed[0]
    assert donor in {b.name for b in old.buffers} and donor not in {b.name for b in new.buffers}
    body = lambda kernel: str(kernel).split("\n", 1)[1]  # noqa: E731  (the listing without the signature)
    assert f"{donor}[" in body(old) and body(new) == body(old).replace(f"{donor}[", f"{output}[")


def two_output_update(reload_after_store: bool) -> Schedule:
    """make: m, p = x, 2x; update: m2 = 0.9 m, p2 = p + m2, both stored at i after loading m[i] and p[i] (an
    optimizer's update with its state); use: out = m2 + p2. With `reload_after_store` the update reads m[i]
    again after storing m2[i]: then m2 must not take m's bytes (the others still may take either)."""
    i = Var("i", 64)
    f32 = tg.float32
    buffers = lambda reads, writes: ([KernelParam(n, f32, 64, False) for n in reads]  # noqa: E731
                                     + [KernelParam(n, f32, 64, True) for n in writes])
    x_value, m, p, m2, p2 = (Ref(n, f32) for n in ("vx", "vm", "vp", "vm2", "vp2"))
    make = Kernel("make", buffers(["x"], ["m", "p"]), [Loop(i, [
        Load("vx", f32, "x", i), Store("m", i, x_value), Let("vp", f32, Op.ADD, (x_value, x_value)),
        Store("p", i, p)])])
    update_body = [Load("vm", f32, "m", i), Load("vp", f32, "p", i), Let("vm2", f32, Op.MUL, (m, Lit(0.9, f32))),
                   Store("m2", i, m2)]
    if reload_after_store:
        update_body += [Load("vm_again", f32, "m", i), Let("vp2", f32, Op.ADD, (p, Ref("vm_again", f32)))]
    else:
        update_body += [Let("vp2", f32, Op.ADD, (p, m2))]
    update = Kernel("update", buffers(["m", "p"], ["m2", "p2"]), [Loop(i, update_body + [Store("p2", i, p2)])])
    use = Kernel("use", buffers(["m2", "p2"], ["out"]), [Loop(i, [
        Load("vm2", f32, "m2", i), Load("vp2", f32, "p2", i), Let("vo", f32, Op.ADD, (m2, p2)),
        Store("out", i, Ref("vo", f32))])])
    x = tg.tensor(np.arange(64, dtype=np.float32))
    nodes = {name: (x * (k + 2)).node for k, name in enumerate(["m", "p", "m2", "p2", "out"])}
    specs = [BufferSpec("x", x.node, "input")] + [BufferSpec(n, node, "output" if n == "out" else "temp")
                                                  for n, node in nodes.items()]
    return Schedule([make, update, use], specs, ["out"])


def test_a_kernel_storing_several_outputs_hands_each_the_bytes_of_an_input_it_read_at_that_index() -> None:
    """The planner and the verifier agree on kernels with several stores: each output is checked on its own."""
    schedule = two_output_update(reload_after_store=False)
    plan = plan_memory(schedule)
    assert sorted(plan.in_place) == [("m", "m2"), ("p", "p2")]
    verify_plan(schedule, plan)
    reloading = two_output_update(reload_after_store=True)
    reloading_plan = plan_memory(reloading)
    assert ("m", "m2") not in reloading_plan.in_place and len(reloading_plan.in_place) == 2
    verify_plan(reloading, reloading_plan)
    with pytest.raises(MemoryPlanError, match="m and m2 share bytes"):
        verify_plan(reloading, plan)


@pytest.mark.skipif(not gemm.available(), reason="needs AVX-512F and a C compiler")
def test_a_conv_writes_its_output_over_the_residual_it_adds() -> None:
    """A residual that dies in the conv adding it lends the output its bytes (gemm.h, tg_conv2d_fn), and the block
    still computes torch's values."""
    rng = np.random.default_rng(0)
    x, w1, w2 = (rng.normal(size=shape).astype(np.float32) for shape in [(1, 16, 12, 12), (16, 16, 1, 1),
                                                                          (16, 16, 3, 3)])

    def block(x: tg.Tensor) -> tg.Tensor:  # its sum over the channels: the block's result is a temporary too
        shortcut = F.conv2d(x, tg.tensor(w1))
        return F.relu(F.conv2d(F.relu(shortcut), tg.tensor(w2), padding=1) + shortcut).sum(1)

    schedule = schedule_kernels([block(tg.tensor(x)).node])
    adds = [k for k in schedule.kernels if len(k.body) == 1 and isinstance(k.body[0], ConvCall) and k.body[0].residual]
    assert len(adds) == 1
    call = adds[0].body[0]
    assert (call.residual, call.out) in plan_memory(order_for_memory(schedule)).in_place
    torch = pytest.importorskip("torch")
    shortcut = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w1))
    expected = torch.relu(torch.nn.functional.conv2d(torch.relu(shortcut), torch.from_numpy(w2), padding=1)
                          + shortcut).sum(1)
    np.testing.assert_allclose(tg.compile(block)(tg.tensor(x)).numpy(), expected.numpy(), rtol=1e-4, atol=1e-4)


def test_a_conv_whose_kernel_writes_before_it_reads_keeps_its_output_apart() -> None:
    """The BLAS conv kernel writes its product before adding the residual: no handoff there, nor into a slice."""
    call = ConvCall(1, 4, 5, 5, 4, (1, 1), (1, 1), (0, 0), (1, 1), "x", "w", "out", "tg_conv2d_im2col_f32",
                    residual="r")
    kernel = Kernel("k", [KernelParam(n, tg.float32, 100, n == "out") for n in ("x", "w", "r", "out")], [call])
    assert not writes_in_place_safely(kernel, "r", "out")
    over = dataclasses.replace(call, residual_over_output=True)
    assert writes_in_place_safely(dataclasses.replace(kernel, body=[over]), "r", "out")
    sliced = dataclasses.replace(over, out_offset=4)
    assert not writes_in_place_safely(dataclasses.replace(kernel, body=[sliced]), "r", "out")
