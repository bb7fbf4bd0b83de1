"""Scheduling: partition a graph into fused kernels of loop IR (see `schedule.fusion`)."""

from tensorgraphs.schedule.fusion import Schedule, count_kernels, schedule_kernels

__all__ = ["Schedule", "count_kernels", "schedule_kernels"]
