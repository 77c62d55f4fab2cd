"""HotpotQA (distractor setting)."""
