"""OpenKP (MS MARCO keyphrase extraction)."""
