"""Text for the gateway: a model's tokenizer and chat template (fetched from a daemon's GetModel),
incremental detokenization and stop-string matching. No I/O here: plain classes fed with bytes,
strings and token ids."""
