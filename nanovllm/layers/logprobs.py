"""Log probabilities on the device: the chosen token's logprob and rank plus the top-k, packed
into one float32 tensor (ids as int32 bits) so that they reach the host in one copy."""
import torch


def raw_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """float32 log_softmax of logits as the model produced them: vLLM's default logprobs, of
    the raw distribution (before temperature, top-k/top-p/min-p and penalties)."""
    return torch.log_softmax(logits, dim=-1, dtype=torch.float32)


def pack_logprobs(logprobs: torch.Tensor, chosen: torch.Tensor, k: int) -> torch.Tensor:
    """[rows, 2 + 2k]: the chosen token's logprob, its rank (int32 bits), the top-k logprobs,
    then the top-k ids (int32 bits); logprobs is [rows, vocab], chosen [rows] token ids."""
    out = torch.empty(logprobs.size(0), 2 + 2 * k, dtype=torch.float32, device=logprobs.device)
    ints = out.view(torch.int32)
    own = logprobs.gather(1, chosen.long().unsqueeze(1))
    out[:, 0] = own.squeeze(1)
    # vLLM's rank: how many tokens are at least as likely (itself included), so a token tied
    # with others ranks last among them.
    ints[:, 1] = (logprobs >= own).sum(-1)
    if k:
        top = logprobs.topk(k, dim=-1)
        out[:, 2: 2 + k] = top.values
        ints[:, 2 + k:] = top.indices
    return out
