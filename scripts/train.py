"""Train: ``python scripts/train.py [hydra overrides]``; sweep with ``-m``; check without training
with ``--check``. See README.md. The project is installed (``pip install -e .``, ``make setup``);
inside a Ray job the job's working dir is on the path."""

from pipeline.tools.cli import main

if __name__ == "__main__":
    main()
