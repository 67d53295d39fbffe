"""How the decode kernel (triton_decode.py) splits a row's keys among programs: how many
splits a call launches, and, with decode_config's SPLIT_KEYS, the fewest keys a split takes."""
import torch
import triton

from nanovllm.kernels._common import INTERPRET
from nanovllm.kernels.decode_config import CONFIG, MAX_SPLITS


def _num_sms(device):
    if INTERPRET or device.type != "cuda":
        return 132  # H100 SXM; only used to pick a split count
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_num_splits(batch, num_kv_heads, device=torch.device("cuda"), keyed=False):
    """Shape-only split count: ~2 programs per SM below the SM count, 2 splits below
    TWO_SPLITS_BELOW programs per SM, none past that; KEYED_SPLITS past it when `keyed`
    (min_split_keys then sizes each row's splits by its length)."""
    # Measured on H100 (16/8/128, bf16, block 256): small batches need splits (b=1 ctx 4096:
    # 177 -> 1339 GB/s), and many splits cost bandwidth (b=32 ctx 1024: 1 split 2774 GB/s vs
    # 8 splits 2485). Two splits still pay up to ~4 programs per SM: see decode_config.
    num_sms = _num_sms(torch.device(device))
    programs = max(batch * num_kv_heads, 1)
    if programs >= num_sms:
        if keyed:
            return CONFIG["KEYED_SPLITS"]
        return 2 if programs < CONFIG["TWO_SPLITS_BELOW"] * num_sms else 1
    return min(MAX_SPLITS, triton.next_power_of_2(triton.cdiv(CONFIG["WAVES"] * num_sms, programs)))


def min_split_keys(batch, num_kv_heads, device, block_n) -> int:
    """The fewest keys a split takes, in whole tiles (0: a row's keys in num_splits even
    parts): SPLIT_KEYS past one program an SM, so a short row runs whole in one program,
    which writes its output with no combine, and a long one in up to KEYED_SPLITS."""
    keys = CONFIG["SPLIT_KEYS"]
    if not keys or batch * num_kv_heads < _num_sms(torch.device(device)):
        return 0
    return triton.cdiv(keys, block_n) * block_n
