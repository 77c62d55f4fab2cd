"""What the project measures about itself, behind scripts/bench_*.py: retrieval quality and speed of
`ask` (ask), its indexing against MiniLM alone (indexing), Hub-style QA readers against `ask` on long
documents (readers), timed multi-hop training runs (multihop), the encoder's targets judged on a `longdoc bench` run
(targets), `longdoc ask` against Haystack (haystack), and the CPU attention kernels' builds side by
side (kernel_builds). Not part of the installed package: the scripts put the checkout on the
path."""
