"""Benchmarks behind `kioku bench`: each module has `run(...) -> dict` printed as JSON."""
