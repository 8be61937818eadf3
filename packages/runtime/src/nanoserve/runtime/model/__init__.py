"""The Llama forward, its weights' forms, and the paged K/V pool it reads and writes."""
