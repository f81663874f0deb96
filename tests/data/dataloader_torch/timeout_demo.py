import time, torch
from torch.utils.data import DataLoader, Dataset, get_worker_info
class D(Dataset):
    def __len__(self): return 8
    def __getitem__(self, b):
        if b == 0: time.sleep(30)          # worker 0 hangs on batch 0
        if b in (1, 3): time.sleep(1.5)    # worker 1: batch 1 at ~1.5 s, batch 3 at ~3.0 s
        return b
for in_order in (True, False):
    it = iter(DataLoader(D(), batch_size=None, num_workers=2, prefetch_factor=2, timeout=2, in_order=in_order))
    t0 = time.monotonic(); got = []
    try:
        while True: got.append(next(it))
    except RuntimeError as e:
        print(f"in_order={in_order}: got {got}, {e} at {time.monotonic()-t0:.2f} s after the first next()")
    t1 = time.monotonic()
    try: next(it)
    except RuntimeError as e: print(f"  again: {e} after {time.monotonic()-t1:.2f} s more")
    del it
