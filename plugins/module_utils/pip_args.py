"""Where pip takes packages from: the one rule for every pip install the roles run (roles/sglang install.yml and
weights.yml, roles/sglang_bench), through the filter plugins/filter/pip_args.py.

- an index (`--index-url`) replaces PyPI; an extra index (`--extra-index-url`) is searched as well;
- a wheelhouse (`--find-links`, a path or a URL) is searched beside them; with no index of either kind it is the
  only source (`--no-index`): an offline site's mirror, and the lab's wheelhouse. pip drops every index under
  `--no-index` (pip 26.3 `_internal/index/collector.py` LinkCollector.create), so an extra index given with a
  wheelhouse keeps the indexes searched rather than being dropped without a word.
"""

from __future__ import annotations


def pip_source_args(index_url: str = "", extra_index_url: str = "", find_links: str = "") -> list[str]:
    """pip's arguments for these sources (empty strings: not given), as a list of separate arguments."""
    args = ["--index-url", index_url] if index_url else []
    args += ["--extra-index-url", extra_index_url] if extra_index_url else []
    if find_links:
        args += (["--no-index"] if not (index_url or extra_index_url) else []) + ["--find-links", find_links]
    return args
