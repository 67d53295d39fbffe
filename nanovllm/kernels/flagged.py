"""Flagged words: a value handed from one program to others with the epoch it belongs to, in
one 8-byte store (fp32 bits low, epoch high), so a reader that sees the epoch sees the value
without a fence or a barrier between them (NCCL's "LL" protocol). The batch-1 layer kernel's
phases hand their outputs over this way with layer_config.CONFIG["LL"]."""
import triton
import triton.language as tl


@triton.jit
def ll_word(v, epoch):
    """Values v (fp32 tensor) as flagged words (int64): the value's bits low, epoch high. An
    aligned 8-byte store lands whole, so a reader that sees the epoch sees the value."""
    bits = v.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    return bits | (epoch.to(tl.int64) << 32)


@triton.jit
def masked_by(mask, flag, want):
    """mask where the scalar flag == want (the interpreter cannot `&` a scalar into a block)."""
    return mask & ((tl.zeros(mask.shape, tl.int32) + flag) == want)


@triton.jit
def ll_load(ptr, offs, mask, epoch, POLL: tl.constexpr):
    """The fp32 values of the flagged words at ptr + offs (ll_word). POLL: read again until
    every word the program reads carries epoch (the words stand in for a grid barrier: each
    producer's stores need no fence, and the poll that ends the wait brings the values);
    else once, for words this program has already seen complete."""
    w = tl.load(ptr + offs, mask=mask, other=0, volatile=True)
    if POLL:
        late = tl.max(tl.where(mask & ((w >> 32).to(tl.int32) != epoch), 1, 0), axis=0)
        while late != 0:
            w = tl.load(ptr + offs, mask=mask, other=0, volatile=True)
            late = tl.max(tl.where(mask & ((w >> 32).to(tl.int32) != epoch), 1, 0), axis=0)
    return w.to(tl.int32).to(tl.float32, bitcast=True)
