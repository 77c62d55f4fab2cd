"""What the project measures about itself, behind scripts/bench_*.py: retrieval quality and speed of
`ask` (ask), its indexing against MiniLM alone (indexing), Hub-style QA readers against `ask` on long
documents (readers), timed multi-hop training runs (multihop), and the encoder's targets judged on a
`longdoc bench` run (targets). Not part of the installed package: the scripts put the checkout on the
path."""
