"""testinfra suites that `provision verify` runs, one file per phase."""
