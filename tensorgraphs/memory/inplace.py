"""When a kernel may write its output over an input that dies in it.

Safe only when every element of the output is written once, from values loaded
at that same element of the input earlier in the same loop body: then no load
ever sees an element the kernel has already overwritten, whatever order the
iterations (or threads) run in. Anything else (reductions over the input, views
that read other elements, staging tiles, several or accumulating stores to the
output) keeps the output in bytes of its own. A library conv does the same with
its residual where its kernel's contract says so (`ConvCall.adds_in_place`). A
kernel storing several outputs (an optimizer's update and its new state,
`schedule.fusion.store_in_consumers`) is checked output by output: stores to
other arrays never touch the donor.
"""

from __future__ import annotations

import dataclasses

from tensorgraphs.codegen.loop_ir import ConvCall, Kernel, Load, Local, Loop, Reduce, Stmt, Store, rename_buffer


def _blocks(body: list[Stmt]) -> list[list[Stmt]]:
    """Every statement list of a kernel body (the body itself and each loop's or reduction's)."""
    found = [body]
    for stmt in body:
        if isinstance(stmt, (Loop, Reduce)):
            found += _blocks(stmt.body)
    return found


def writes_in_place_safely(kernel: Kernel, donor: str, output: str) -> bool:
    """True when `kernel` computes the same values if `output` occupies `donor`'s bytes."""
    writes = {b.name: b.writes for b in kernel.buffers}
    if writes.get(donor, True) or not writes.get(output, False):
        return False
    if len(kernel.body) == 1 and isinstance(kernel.body[0], ConvCall):
        return kernel.body[0].adds_in_place(donor, output)
    blocks = _blocks(kernel.body)
    if any(isinstance(s, Local) for block in blocks for s in block):
        return False
    stores = [(block, i, s) for block in blocks for i, s in enumerate(block)
              if isinstance(s, Store) and s.buffer == output]
    if len(stores) != 1 or stores[0][2].accumulate:
        return False
    store_block, store_position, store = stores[0]
    for block in blocks:
        for position, stmt in enumerate(block):
            if isinstance(stmt, Load) and stmt.buffer == donor:
                if block is not store_block or position > store_position or stmt.index != store.index:
                    return False
    return True


def read_through_output(kernel: Kernel, donor: str, output: str) -> Kernel:
    """`kernel` loading `donor`'s elements through `output`'s pointer (the same bytes once planned in place).

    The kernel then takes one pointer where it had two aliasing ones: the C parameters stay `restrict`-correct.
    """
    return dataclasses.replace(kernel, buffers=[b for b in kernel.buffers if b.name != donor],
                               body=[rename_buffer(stmt, donor, output) for stmt in kernel.body])


def alias_free(kernels: list[Kernel], pairs: list[tuple[str, str]]) -> list[Kernel]:
    """`kernels` with each in-place (donor, output) pair read through the output, in the kernel creating it."""
    donor_of = {output: donor for donor, output in pairs}
    rewritten = []
    for kernel in kernels:
        names = {b.name for b in kernel.buffers}
        for output in [b.name for b in kernel.buffers if b.writes and donor_of.get(b.name) in names]:
            kernel = read_through_output(kernel, donor_of[output], output)
        rewritten.append(kernel)
    return rewritten
