"""How many splits the decode kernel (triton_decode.py) gives each row's keys: a shape-only
rule, by programs (rows x kv heads) against the SM count."""
import torch
import triton

from nanovllm.kernels._common import INTERPRET
from nanovllm.kernels.decode_config import CONFIG, MAX_SPLITS


def _num_sms(device):
    if INTERPRET or device.type != "cuda":
        return 132  # H100 SXM; only used to pick a split count
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_num_splits(batch, num_kv_heads, device=torch.device("cuda")):
    """Shape-only split count: ~2 programs per SM below the SM count, 2 splits below
    TWO_SPLITS_BELOW programs per SM, none past that."""
    # Measured on H100 (16/8/128, bf16, block 256): small batches need splits (b=1 ctx 4096:
    # 177 -> 1339 GB/s), and many splits cost bandwidth (b=32 ctx 1024: 1 split 2774 GB/s vs
    # 8 splits 2485). Two splits still pay up to ~4 programs per SM: see decode_config.
    # (Splits by each row's length, a short row whole and a long one in up to 4 or 8, were
    # timed slower on an H200 at 128-256 rows: docs/PERF_NOTES.md, forty-fourth session.)
    num_sms = _num_sms(torch.device(device))
    programs = max(batch * num_kv_heads, 1)
    if programs >= num_sms:
        return 2 if programs < CONFIG["TWO_SPLITS_BELOW"] * num_sms else 1
    return min(MAX_SPLITS, triton.next_power_of_2(triton.cdiv(CONFIG["WAVES"] * num_sms, programs)))
