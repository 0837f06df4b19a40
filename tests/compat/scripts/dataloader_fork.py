"""Contract: a DataLoader with num_workers=2 and multiprocessing_context="fork" loads a script-defined Dataset."""
import os
import sys

import torch
from torch.utils.data import DataLoader, Dataset

RANK = int(os.environ["RANK"])


class Squares(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor(i * i)


if __name__ == "__main__":
    loader = DataLoader(Squares(), batch_size=4, num_workers=2, multiprocessing_context="fork")
    total = sum(int(batch.sum()) for batch in loader)
    sys.stdout.write(f"FACT rank={RANK} total={total}\n")
