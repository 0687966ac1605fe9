"""A stand-in for SGLang's HTTP server, for the provision lab only.

It accepts the command line of `python -m sglang.launch_server` (the flag list is taken from
the real sglang wheel's source when the lab builds this package, and unknown flags are
refused as argparse would) and behaves as SGLang 0.5.23 does where provision can notice, each
behaviour naming the wheel's file and line it copies: `--config FILE.yaml` keys become
`--api-key VALUE` in `launch_command`, and `/server_info` returns it with `api_key`; the resolved
arguments, key included, are logged at startup; a parent (tokenizer manager + HTTP) and two
spawned children (scheduler, detokenizer) serve each request together; the port is bound only
after the "model" loads; only the parent drains on SIGTERM, and a dead child takes the server
down. `GET /lab/env` lets tests read its environment and children. It has no model: answers
come from a tiny rule set ("What is 7 * 13?" gets 91) and generated tokens are filler. Numbers
measured against it mean nothing.
"""

from importlib.metadata import version

# the lab builds this package's wheel at the sglang release the sglang role pins (provision/lab/wheelhouse.py), and
# the stand-in reports that version as SGLang's /server_info does
__version__ = version(__name__)
