"""Ray Data: `generate_dataset(ds, model, sampling_params, data_parallel_size=N, ...)` maps
a ray.data.Dataset's batches through N LLM actors (Ray Data's actor pool; vLLM's Ray Data
processor works the same way) and returns a Dataset with the generated columns added
(`pip install -e ".[ray]"`). For cores as Ray actors behind one LLM, see ray_client.py.
"""
from nanovllm.config import Config
from nanovllm.llm import LLM
from nanovllm.ray_client import bundle_for, ray_module


def _replica_kwargs(kwargs: dict, bundle: dict) -> dict:
    """A replica's LLM options: one replica, on the GPUs Ray gave the actor."""
    kwargs = {**kwargs, "data_parallel_size": 1, "distributed_executor_backend": "mp"}
    if "GPU" in bundle:
        kwargs["device"] = "cuda:0"
    return kwargs


class LLMProcessor:
    """A Ray Data map_batches callable: one replica per actor, generating for the batch's
    prompt column; adds generated_text, generated_token_ids and finish_reason."""

    def __init__(self, model: str, sampling_params=None, prompt_column: str = "prompt",
                 **kwargs):
        self.llm = LLM(model, **kwargs)
        self.sampling_params, self.column = sampling_params, prompt_column

    def __call__(self, batch: dict) -> dict:
        """Generate for one Ray Data batch; adds generated_text and generated_token_ids."""
        prompts = [p.tolist() if hasattr(p, "tolist") else p for p in batch[self.column]]
        outputs = self.llm.generate(prompts, self.sampling_params, use_tqdm=False)
        return {**batch, "generated_text": [o["text"] for o in outputs],
                "generated_token_ids": [o["token_ids"] for o in outputs],
                "finish_reason": [o["finish_reason"] for o in outputs]}


def generate_dataset(ds, model: str, sampling_params=None, prompt_column: str = "prompt",
                     batch_size: int = 256, **kwargs):
    """ds (a ray.data.Dataset with a prompt column: text or token ids) with the generated
    columns added, through data_parallel_size replica actors; lazy, as Ray Data is."""
    ray = ray_module()
    config = Config.from_kwargs(model, **kwargs)  # bad options fail here, not in an actor
    bundle = bundle_for(config, ray)
    return ds.map_batches(
        LLMProcessor, batch_size=batch_size, concurrency=config.data_parallel_size,
        num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0),
        fn_constructor_args=(config.model, sampling_params, prompt_column),
        fn_constructor_kwargs=_replica_kwargs(kwargs, bundle))
