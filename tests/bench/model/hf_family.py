"""transformers' own model of a Llama-style family for the benchmarks' PyTorch peers (llama_torch_step.py, and
../train/fsdp2_llama.py), built from fsdpc's shape names, so that both peers build the same model a row names."""

# the family's config and model classes in transformers
CLASSES = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
           "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM")}


def build(transformers, family, *, vocab, n_embd, intermediate_size, n_layer, n_head, n_kv_head, seq, tie=False,
          head_dim=0, rope_llama3=False, sliding_window=0):
    """head_dim 0 = n_embd / n_head; rope_llama3: Llama 3.1's scaling, factors 8, 1, 4 and an original context
    of 64 (bench_runner.c's); sliding_window (mistral) 0 = none."""
    kw = dict(vocab_size=vocab, hidden_size=n_embd, intermediate_size=intermediate_size, num_hidden_layers=n_layer,
              num_attention_heads=n_head, num_key_value_heads=n_kv_head, max_position_embeddings=seq,
              tie_word_embeddings=tie, use_cache=False)
    if head_dim:
        kw["head_dim"] = head_dim
    if rope_llama3:
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}
        # transformers 5 reads rope_parameters (with the base), 4.x rope_scaling
        if "rope_parameters" in transformers.LlamaConfig.__init__.__code__.co_varnames:
            kw["rope_parameters"] = dict(rope, rope_theta=10000.0)
        else:
            kw["rope_scaling"] = rope
    if family == "mistral":
        kw["sliding_window"] = sliding_window or None
    config_cls, model_cls = CLASSES[family]
    return getattr(transformers, model_cls)(getattr(transformers, config_cls)(**kw))
