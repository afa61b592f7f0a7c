"""`python -m autopar.calibrate [...]` is `autopar calibrate [...]` (for `torchrun -m autopar.calibrate`)."""

import sys

from autopar.cli import main

sys.exit(main(["calibrate", *sys.argv[1:]]))
