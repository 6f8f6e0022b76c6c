import sys

from workbench.cli import main

sys.exit(main())
