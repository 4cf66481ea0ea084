import sys

from llmgw.cli import main

sys.exit(main())
