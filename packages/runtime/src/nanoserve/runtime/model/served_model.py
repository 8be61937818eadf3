"""ServedModel: what an engine serves, a decoder (LlamaModel: paged K/V, generation and
pooling) or a BERT-family encoder (EncoderModel: whole inputs, embeddings and scores), and the
one place a checkpoint picks which.

Both give the final hidden states of a step's selected rows (`hidden`) and take the same
weight forms; only a decoder has an LM head (`logits`), decode steps to record, and K/V to keep.
"""

from __future__ import annotations

from typing import TypeAlias

from nanoserve.runtime.loading.checkpoint import Checkpoint
from nanoserve.runtime.model.encoder import EncoderModel
from nanoserve.runtime.model.llama import LlamaModel

ServedModel: TypeAlias = LlamaModel | EncoderModel


def load_model(checkpoint: Checkpoint, **kwargs: object) -> ServedModel:
    """The model a checkpoint holds, built in the weight form and place `kwargs` say."""
    if checkpoint.config.encoder is not None:
        return EncoderModel.from_checkpoint(checkpoint, **kwargs)
    return LlamaModel.from_checkpoint(checkpoint, **kwargs)
