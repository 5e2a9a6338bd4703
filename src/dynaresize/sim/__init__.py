"""The digital twin: simulated devices, cost models, workloads and virtual time.

The same orchestrator that drives real devices runs here on `SimDevice`s under a
`VirtualClock`; see docs/simulator.md.
"""

from dynaresize.sim.clock import VirtualClock, VirtualEventLoop, VirtualTimeDeadlock, run_virtual

__all__ = ["VirtualClock", "VirtualEventLoop", "VirtualTimeDeadlock", "run_virtual"]
