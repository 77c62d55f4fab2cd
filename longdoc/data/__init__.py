"""From documents to model inputs: examples, text splitting, windows, features, spans, batching, the feature cache."""
