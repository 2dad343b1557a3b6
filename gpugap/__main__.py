import sys

from gpugap.cli import main

sys.exit(main())
