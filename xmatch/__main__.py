"""``python -m xmatch`` (and ``torchrun -m xmatch train ...``) runs the command line."""

import sys

from xmatch.cli import main

sys.exit(main())
