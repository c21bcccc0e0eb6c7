"""Chunked log-prob / entropy autograd functions (torch, and Triton on CUDA)."""
