"""`python -m provision` is the same as the `provision` command."""

import sys

from provision.cli import main

sys.exit(main())
