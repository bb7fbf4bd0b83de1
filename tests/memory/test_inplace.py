"""In-place writes: allowed only where every output element is computed from the same input element."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.memory.inplace import alias_free, writes_in_place_safely
from tensorgraphs.memory.order import order_for_memory
from tensorgraphs.memory.packing import plan_memory
from tensorgraphs.schedule.fusion import Schedule, schedule_kernels


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
