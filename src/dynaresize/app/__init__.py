"""The application around the orchestrator: runner (Ray wiring), report, benchmarks, progress,
metric sinks."""
