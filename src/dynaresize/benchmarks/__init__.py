"""Benchmarks of the real path (Ray devices, gloo, FSDP2): `dynaresize bench …`."""
