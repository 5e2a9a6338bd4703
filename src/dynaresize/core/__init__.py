"""Pure data shared by every layer: types, allocation, samples, advantages, streams, timeline,
the run directory writer."""
