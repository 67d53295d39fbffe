"""GPU engine runs of a small random Qwen3 with each KV cache dtype: the block counts and the
greedy tokens that the 8-bit cache tests compare."""
import torch


def blocks_and_tokens(tmp_path, kinds, check=None) -> tuple[dict, dict]:
    """({kind: KV blocks}, {kind: token ids of two greedy 32-token outputs}); check(llm, kind),
    if given, looks at each engine before it stops."""
    from nanovllm import LLM, SamplingParams
    from nanovllm.utils.toy import save_random_qwen3

    path = save_random_qwen3(str(tmp_path / "m"), num_attention_heads=8, num_key_value_heads=2,
                             head_dim=64, hidden_size=128, num_hidden_layers=2)
    blocks, outs = {}, {}
    for kind in kinds:
        # Small limits: a quick start-up (few decode graphs, a short warm-up prefill).
        llm = LLM(path, kv_cache_dtype=kind, gpu_memory_utilization=0.3, max_num_seqs=8,
                  max_num_batched_tokens=1024, max_model_len=1024)
        try:
            sp = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
            outs[kind] = [o["token_ids"] for o in llm.generate([[1, 2, 3] * 50, [9] * 70], sp,
                                                               use_tqdm=False)]
            blocks[kind] = llm.clients[0].core.executor.num_kvcache_blocks
            if check is not None:
                check(llm, kind)
        finally:
            llm.shutdown()
            torch.cuda.empty_cache()
    return blocks, outs
