"""`python -m nanovllm ...`: the same as the `nanovllm` console script."""
import sys

from nanovllm.cli import main

sys.exit(main())
