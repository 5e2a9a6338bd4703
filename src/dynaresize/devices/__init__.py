"""Device backends: RayDevice (real torch processes) and, in dynaresize.sim, SimDevice."""
