import sys

from tools.bench.stream_latency.cli import main

sys.exit(main())
