"""``python -m ppdnmf_torch``: the Hydra app (same as the ``ppdnmf`` command)."""
from .cli import main

if __name__ == "__main__":
    main()
