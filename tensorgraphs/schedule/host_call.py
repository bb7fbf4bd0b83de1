"""The kernel of a `host_call` node (`graph.host_call`): one call back into the running process."""

from __future__ import annotations

from tensorgraphs.codegen.loop_ir import HostCall, Kernel, KernelParam
from tensorgraphs.schedule.extern import LibraryCallLowering


class HostCallLowering(LibraryCallLowering):
    """Reads its sources' buffers (the source, and the node it waits for), writes its own."""

    def kernel(self) -> Kernel:
        source, *after = self.node.src
        output = self.buffers[self.node]
        params = {self.buffers[s]: KernelParam(self.buffers[s], s.dtype, s.size, False) for s in self.node.src}
        params[output] = KernelParam(output, self.node.dtype, self.node.size, True)
        call = HostCall(dict(self.node.arg)["function"], self.buffers[source], output, self.node.size,
                        self.buffers[after[0]] if after else None)
        return Kernel(self.name, list(params.values()), [call])
