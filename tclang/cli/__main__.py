"""`python -m tclang.cli`: the `tclang` command."""

import sys

from tclang.cli import main

sys.exit(main())
