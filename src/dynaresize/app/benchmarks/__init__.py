"""dynaresize.app.benchmarks."""
