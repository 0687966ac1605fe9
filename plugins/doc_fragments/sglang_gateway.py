"""The options every module that talks to SGLang's gateway on its host takes (module_utils/sglang_gateway.py
settings), documented once: `extends_documentation_fragment: provision.pve_sglang.sglang_gateway`."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  url:
    description: The gateway's base URL on its host (unset - from I(record), else C(http://127.0.0.1:30000)).
    type: str
  control_key_file:
    description:
      - The file holding the gateway's control-plane key entry (C(id:name:role:key)); unset - from I(record), else no
        key is sent.
    type: path
  record:
    description:
      - The gateway's record, which the sglang_gateway role writes (C(sglang-gateway.json) in C(provision_state_dir)).
        Where I(url) or I(control_key_file) is not given, it is taken from there. A missing record is a gateway not
        set up yet.
    type: path
"""
