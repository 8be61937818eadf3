"""OpenAI's routes: completions, chat completions, models, tokenize/detokenize/render."""
