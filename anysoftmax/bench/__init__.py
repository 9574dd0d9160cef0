"""Benchmarks of anysoftmax against its peers (run from the repository root)."""
