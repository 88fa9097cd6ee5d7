"""``python -m ppdnmf_torch.distributed`` (and ``torchrun ... -m ppdnmf_torch.distributed``)."""
from ..app.distributed import main

if __name__ == "__main__":
    main()
