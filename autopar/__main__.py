"""`python -m autopar ...` runs the CLI."""

import sys

from autopar.cli import main

sys.exit(main())
