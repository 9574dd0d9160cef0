"""Kernels shared by several backends (one algorithm, several launchers)."""
