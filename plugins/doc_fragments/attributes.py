"""What the check_mode and diff_mode attributes mean, documented once: a module lists
`extends_documentation_fragment: provision.pve_sglang.attributes` and says only its `support` for each."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: In check mode the module changes nothing and reports what it would change.
  diff_mode:
    description: In diff mode the module returns the before and after of what it changes (or would change).
"""
