"""SpeculativeConfig: vLLM's JSON or a method's name, refused in one line when impossible."""

from __future__ import annotations

import pytest

from nanoserve.runtime.engine.config.speculative_config import (
    SpeculativeConfig,
    SpeculativeConfigError,
)


def test_parse() -> None:
    assert SpeculativeConfig.parse("ngram") == SpeculativeConfig()
    assert SpeculativeConfig.parse("off") is None
    assert SpeculativeConfig.parse(
        '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5}'
    ) == SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_max=5)
    draft = SpeculativeConfig(method="draft_model", model="d.gguf", num_speculative_tokens=5)
    assert SpeculativeConfig.parse('{"method": "draft_model", "model": "d.gguf"}') == draft
    assert SpeculativeConfig.parse('{"model": "d.gguf"}') == draft  # vLLM: a model is a draft
    assert SpeculativeConfig.draft("d.gguf") == draft
    assert draft.label == "draft_model(k<=5)" and SpeculativeConfig().label == "ngram(k<=8)"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("eagle", "method must be one of ngram, draft_model, got 'eagle'"),
        ('{"method": "draft_model"}', 'draft_model needs "model": a path to the draft'),
        ('{"method": "ngram", "model": "d.gguf"}', "ngram takes no model"),
        ("{", "not JSON"),
        ('{"method": "ngram", "draft": 1}', "unknown key"),
        ('{"num_speculative_tokens": 0}', "num_speculative_tokens must be a positive integer"),
        ('{"prompt_lookup_min": 5, "prompt_lookup_max": 3}', "prompt_lookup_min 5 exceeds"),
    ],
)
def test_refusals_name_the_setting(text: str, message: str) -> None:
    with pytest.raises(SpeculativeConfigError, match=message):
        SpeculativeConfig.parse(text)
