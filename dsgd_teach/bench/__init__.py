"""Benchmarks: each module measures figures as ratios against a reference taken in the same run."""
