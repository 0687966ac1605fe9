"""A stand-in for SGLang's HTTP server, for the provision lab only.

It accepts the command line of `python -m sglang.launch_server` (the flag list is taken from
the real sglang wheel's source when the lab builds this package, and unknown flags are
refused as argparse would), answers SGLang 0.5.x's documented endpoints with their shapes,
takes a while to become ready, drains on SIGTERM, and lets tests read its environment
(`GET /lab/env`). It has no model: answers come from a tiny rule set ("What is 7 * 13?"
gets 91) and generated tokens are filler. Numbers measured against it mean nothing.
"""

__version__ = "0.5.23"
