"""The pooling routes: embeddings (OpenAI), rerank (Jina/Cohere) and score (vLLM)."""
