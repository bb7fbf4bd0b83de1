"""The kernel of a `host_call` node (`graph.host_call`): one call back into the running process."""

from __future__ import annotations

from tensorgraphs.codegen.loop_ir import HostCall, Kernel, KernelParam
from tensorgraphs.graph.host_call import host_call_sources
from tensorgraphs.schedule.extern import LibraryCallLowering


class HostCallLowering(LibraryCallLowering):
    """Reads its sources' buffers (and the one of the node it waits for), writes its own."""

    def kernel(self) -> Kernel:
        sources, after = host_call_sources(self.node)
        output = self.buffers[self.node]
        params = {self.buffers[s]: KernelParam(self.buffers[s], s.dtype, s.size, False) for s in self.node.src}
        params[output] = KernelParam(output, self.node.dtype, self.node.size, True)
        arg = dict(self.node.arg)
        call = HostCall(arg["function"], tuple(self.buffers[s] for s in sources), tuple(s.size for s in sources),
                        output, None if after is None else self.buffers[after], arg["placement"])
        return Kernel(self.name, list(params.values()), [call])
