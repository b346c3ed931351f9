"""Benchmarks of cudagraphs against raw CUDA C and its Python peers.

``cudagraphs bench [--quick] [--out DIR]`` runs them (see :mod:`.runner`).
"""
