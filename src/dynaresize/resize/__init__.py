"""Runtime resizing: pure planners (`planner`, `reshard`) and the executor (`executor`)."""
