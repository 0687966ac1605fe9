"""The options every module that calls the Proxmox VE API takes (module_utils/pve_api.py ARGUMENT_SPEC), documented
once: `extends_documentation_fragment: provision.pve_sglang.pve_api`."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  api_host: {type: str, required: true, description: "PVE API address (proxmox_api_host); empty fails, naming it"}
  api_port: {type: int, default: 8006, description: PVE API port}
  api_user: {type: str, default: root@pam, description: user with realm}
  api_password: {type: str, no_log: true, description: the user's password (a ticket login)}
  api_token_id: {type: str, description: an API token's name (no user! prefix) instead of a password}
  api_token_secret: {type: str, no_log: true, description: the token's secret}
  validate_certs: {type: bool, default: true, description: verify the API's TLS certificate}
  ca_file: {type: path, description: CA bundle for the API certificate}
  retries: {type: int, default: 3, description: attempts for an API that is down or answers 5xx/59x}
"""
