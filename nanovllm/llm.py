"""The user-facing facade."""
from nanovllm.engine.llm_engine import LLMEngine
from nanovllm.engine.prompts import conversation_list
from nanovllm.engine.tokenizer import chat_prompt
from nanovllm.outputs import RequestOutput


class LLM(LLMEngine):
    """`LLM(path, **config).generate(prompts, sampling_params)`, as in vLLM / nano-vLLM.
    With data_parallel_size > 1 it is a DataParallelLLM (replica processes of this host;
    generate, chat, stats, shutdown); with distributed_executor_backend="ray", a RayLLM
    (replicas as Ray actors, across machines; generate, shutdown)."""

    def __new__(cls, model=None, **kwargs):
        if cls is LLM and kwargs.get("distributed_executor_backend") == "ray":
            from nanovllm.ray import RayLLM

            return RayLLM(model, **kwargs)
        if cls is LLM and kwargs.get("data_parallel_size", 1) != 1:
            from nanovllm.engine.data_parallel import DataParallelLLM

            return DataParallelLLM(model, **kwargs)
        return super().__new__(cls)

    def chat(self, messages, sampling_params=None, use_tqdm: bool = True,
             chat_template: str | None = None,
             add_generation_prompt: bool = True) -> list[RequestOutput]:
        """Generate replies to one conversation (a list of {"role", "content"} dicts) or a
        list of conversations, through the chat template; one RequestOutput each."""
        conversations = conversation_list(messages)
        if chat_template is not None and not isinstance(chat_template, str):
            raise ValueError(f"chat_template must be None (the tokenizer's) or a Jinja template "
                             f"string, got {type(chat_template).__name__}")
        prompts = [chat_prompt(self.tokenizer, conv, chat_template, add_generation_prompt)
                   for conv in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)
