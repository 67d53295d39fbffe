"""How the decode kernel (triton_decode.py) splits a row's keys among programs: how many
splits a call launches and, with a config's SPLIT_KEYS (decode_config), the fewest keys a
split takes."""
import torch
import triton

from nanovllm.kernels._common import INTERPRET
from nanovllm.kernels.decode_config import CONFIG, MAX_SPLITS


def _num_sms(device):
    if INTERPRET or device.type != "cuda":
        return 132  # H100 SXM; only used to pick a split count
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_num_splits(batch, num_kv_heads, device=torch.device("cuda"), cfg=None):
    """Shape-only split count: ~2 programs per SM below the SM count, 2 splits below
    TWO_SPLITS_BELOW programs per SM, none past that; past it, the cache's config `cfg`'s
    KEYED_SPLITS when it sets SPLIT_KEYS (min_split_keys then sizes each row's splits)."""
    # Measured on H100 (16/8/128, bf16, block 256): small batches need splits (b=1 ctx 4096:
    # 177 -> 1339 GB/s), and many splits cost bandwidth (b=32 ctx 1024: 1 split 2774 GB/s vs
    # 8 splits 2485). Two splits still pay up to ~4 programs per SM: see decode_config.
    num_sms = _num_sms(torch.device(device))
    programs = max(batch * num_kv_heads, 1)
    if programs >= num_sms:
        if cfg is not None and cfg["SPLIT_KEYS"]:
            return cfg["KEYED_SPLITS"]
        return 2 if programs < CONFIG["TWO_SPLITS_BELOW"] * num_sms else 1
    return min(MAX_SPLITS, triton.next_power_of_2(triton.cdiv(CONFIG["WAVES"] * num_sms, programs)))


def min_split_keys(batch, num_kv_heads, device, cfg) -> int:
    """The fewest keys a split takes, in cfg's whole tiles (0: a row's keys in num_splits
    even parts): cfg's SPLIT_KEYS past one program an SM, so a short row runs whole in one
    program, which writes its output with no combine, and a long one in up to KEYED_SPLITS."""
    keys = cfg["SPLIT_KEYS"]
    if not keys or batch * num_kv_heads < _num_sms(torch.device(device)):
        return 0
    return triton.cdiv(keys, cfg["BLOCK_N"]) * cfg["BLOCK_N"]
