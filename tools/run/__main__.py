import sys

from tools.run.cli import main

sys.exit(main())
