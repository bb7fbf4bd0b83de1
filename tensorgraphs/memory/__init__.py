"""Memory planning: liveness of temporaries over the kernel order, in-place handoffs, one arena by offset.

    schedule -> order_for_memory (a kernel order, then recompute_for_memory) -> temporaries (liveness)
             -> in_place_pairs -> offline packing (ArenaPlan) -> verify_plan

The cpu backend allocates one `Arena` per program and passes pointers into it.
TG_DEBUG=memory prints each plan; TG_POISON=1 fills the arena with NaN bytes before every run.
"""

from tensorgraphs.memory.arena import Arena, poison_enabled
from tensorgraphs.memory.inplace import alias_free, read_through_output, writes_in_place_safely
from tensorgraphs.memory.liveness import Lifetime, temporaries
from tensorgraphs.memory.order import order_for_memory
from tensorgraphs.memory.packing import ALIGNMENT, ArenaPlan, live_bytes, naive_plan, plan_memory
from tensorgraphs.memory.recompute import recompute_for_memory
from tensorgraphs.memory.verify import MemoryPlanError, verify_plan

__all__ = ["ALIGNMENT", "Arena", "ArenaPlan", "Lifetime", "MemoryPlanError", "alias_free", "live_bytes", "naive_plan",
           "order_for_memory", "plan_memory", "poison_enabled", "read_through_output", "recompute_for_memory",
           "temporaries", "verify_plan", "writes_in_place_safely"]
