"""Evaluation around the official metrics: the leaderboard, ROUGE, tables."""
