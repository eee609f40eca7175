"""Reference implementations shared by the tests and the benchmarks.

Two kinds: float64 math (the ground truth for accuracy) and verbatim copies of the eager PyTorch
code of the modules our kernels replace (the bit-level rounding to match, and the "eager"
baseline in benchmarks). The copies are used when the libraries themselves are not installed.
"""
