"""Standalone scripts that roles copy to managed hosts (stdlib plus, where stated, PyTorch)."""
