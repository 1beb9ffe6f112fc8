"""Train: ``python scripts/train.py [hydra overrides]``; sweep with ``-m``. See README.md."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.tools.cli import main

if __name__ == "__main__":
    main()
