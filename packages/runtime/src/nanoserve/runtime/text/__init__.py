"""Text in and out: the tokenizer, incremental detokenizing, chat templates."""
