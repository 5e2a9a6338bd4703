"""Multi-turn, tool-using episodes (issue 26): the environment protocol (`base`), the episode
log that keeps an environment from being stepped twice for a turn (`log`), the episode data
model and its training view (`episode`, `train_view`), rendering observations into context
tokens (`render`), tools and environments built from plain functions and text tasks (`tools`,
`adapters`), the episode driver over an abstract turn generator (`driver`) and a miniature
turn server over engines (`serve`). See docs/agents.md."""
