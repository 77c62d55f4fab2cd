"""The global-local encoder: config, the input schema, side inputs (masks and relative ids), attention, modeling."""
