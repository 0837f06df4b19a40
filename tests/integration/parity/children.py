"""Children started with spawn and forkserver find the functions the script defines."""
import multiprocessing as mp


def square(x):
    return x * x


def collate(batch):
    return [square(x) for x in batch]


def child(index, out):
    out.put(index + 100)


if __name__ == "__main__":
    import torch
    import torch.multiprocessing
    from torch.utils.data import DataLoader

    for method in ("spawn", "forkserver"):
        with mp.get_context(method).Pool(1) as pool:
            print(f"FACT {method} pool {pool.map(square, [2, 3])}", flush=True)
    loader = DataLoader(list(range(4)), batch_size=2, num_workers=1, multiprocessing_context="spawn",
                        collate_fn=collate)
    print(f"FACT dataloader spawn {[b for b in loader]}", flush=True)
    queue = torch.multiprocessing.get_context("spawn").SimpleQueue()
    torch.multiprocessing.spawn(child, args=(queue,), nprocs=1, join=True)
    print(f"FACT torch.multiprocessing.spawn {queue.get()}", flush=True)
