"""Throughput and quality benchmarks (scripts; each prints a table and writes JSON under results/).

A regular package on purpose: google-jetstream installs a top-level `benchmarks` package into site-packages,
which would otherwise shadow this folder when imported from the repository root.
"""
