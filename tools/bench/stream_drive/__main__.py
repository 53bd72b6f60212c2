import sys

from tools.bench.stream_drive.cli import main

sys.exit(main())
