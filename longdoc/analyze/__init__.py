"""`longdoc analyze attention`: what residual attention and talking heads do to a model's attention,
measured on its own weights. Per layer, head and attention piece (l2l, l2g, g2g, g2l): entropy,
sparsity, Jensen-Shannon divergence between adjacent layers and, under residual attention, the share
of the softmax's input carried from the layers before (longdoc.analyze.statistics), summarised into
analysis.json and drawn as PNGs. The path: longdoc.analyze.run."""

# What --statistics chooses among (each names some of the statistics of longdoc.analyze.summary); here,
# where importing costs nothing, for the command line's --help.
STATISTIC_GROUPS = ("entropy", "sparsity", "divergence", "carried-share")
# The figures' file in the output folder (longdoc serve --analysis reads it).
ANALYSIS_FILE = "analysis.json"
