"""The options every module that calls the Proxmox VE API takes (module_utils/pve_api.py ARGUMENT_SPEC), documented
once: `extends_documentation_fragment: provision.pve_sglang.pve_api`.

A doc fragment documents options only. That a secret is never logged is the argument spec's `no_log=True`
(ARGUMENT_SPEC), which Ansible acts on; the option keys a module's documentation may hold are ansible-test
validate-modules' (tests/unit/repository/test_collection.py checks them)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  api_host:
    type: str
    required: true
    description: PVE API address (proxmox_api_host); empty fails, naming it.
  api_port:
    type: int
    default: 8006
    description: PVE API port.
  api_user:
    type: str
    default: root@pam
    description: User with realm.
  api_password:
    type: str
    description:
      - The user's password (a ticket login). Never logged, never in the result.
  api_totp_secret:
    type: str
    description:
      - The base32 secret of the user's TOTP entry, where PVE asks that user for a second factor at login. The code
        is computed at each login (RFC 6238, 30 s steps, 6 digits). Never logged, never in the result.
  api_token_id:
    type: str
    description: An API token's name (no user! prefix) instead of a password.
  api_token_secret:
    type: str
    description:
      - The token's secret. Never logged, never in the result.
  validate_certs:
    type: bool
    default: true
    description: Verify the API's TLS certificate.
  ca_file:
    type: path
    description: CA bundle for the API certificate.
  retries:
    type: int
    default: 3
    description:
      - Attempts for an API that is down or answers 5xx/59x.
"""
